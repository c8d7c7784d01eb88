# Hugging Face checkpoints in and out: names, config.json, logits of imported weights, the CLI.
add_executable(hf_layout_tests interop/test_hf_layout.cpp)
target_link_libraries(hf_layout_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(hf_layout_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
# Files from others, mutated: checkpoints, Hugging Face directories, tokenizers, traces (issue 34).
add_executable(reader_fuzz_tests interop/test_reader_fuzz.cpp)
target_link_libraries(reader_fuzz_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(reader_fuzz_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
