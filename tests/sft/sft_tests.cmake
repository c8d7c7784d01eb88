# Supervised fine-tuning data (issue 17): prompt/response JSONL packing and the loss mask (unit), masked
# cross-entropy single-device and vocabulary-parallel (unit, ranks as threads), and the trainer's parity across
# layouts on a JSONL file (train).
add_executable(sft_tests sft/test_sft_data.cpp sft/test_masked_loss.cpp)
target_link_libraries(sft_tests PRIVATE crosstrain GTest::gtest_main)
gtest_discover_tests(sft_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
add_executable(sft_train_tests sft/test_sft_train.cpp)
target_include_directories(sft_train_tests PRIVATE train)
target_link_libraries(sft_train_tests PRIVATE crosstrain GTest::gtest_main)
gtest_discover_tests(sft_train_tests PROPERTIES LABELS train TIMEOUT 600 DISCOVERY_TIMEOUT 60)
