# Tokenizers without libtorch (BPE, SentencePiece through its module, `crosstrain tokenize`).
add_executable(data_tests data/test_bpe.cpp data/test_sentencepiece.cpp data/test_tokenize_cli.cpp)
target_compile_options(data_tests PRIVATE -Wall -Wextra)
target_link_libraries(data_tests PRIVATE crosstrain_data_pure crosstrain_core_pure ct_support GTest::gtest_main)
target_compile_definitions(data_tests PRIVATE CROSSTRAIN_BINARY="$<TARGET_FILE:crosstrain_app>"
  CROSSTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_dependencies(data_tests crosstrain_app crosstrain_sentencepiece)
gtest_discover_tests(data_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
# Datasets: token files, text, the data-parallel sampler; SFT data and loss masks.
add_executable(token_file_tests data/test_token_dataset.cpp data/test_dataset.cpp)
target_link_libraries(token_file_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(token_file_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
add_executable(sft_tests data/test_sft_data.cpp data/test_masked_loss.cpp)
target_link_libraries(sft_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(sft_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
