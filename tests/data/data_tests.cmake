# Tokenization (issue 17): SentencePiece and byte-level BPE without libtorch, `crosstrain tokenize` end to end,
# and token files as the trainer reads them (libtorch: batches are tensors).
add_executable(data_tests data/test_bpe.cpp data/test_sentencepiece.cpp data/test_tokenize_cli.cpp)
target_compile_options(data_tests PRIVATE -Wall -Wextra)
target_link_libraries(data_tests PRIVATE crosstrain_data_pure crosstrain_core_pure GTest::gtest_main Threads::Threads)
target_compile_definitions(data_tests PRIVATE CROSSTRAIN_BINARY="$<TARGET_FILE:crosstrain_app>"
  CROSSTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_dependencies(data_tests crosstrain_app crosstrain_sentencepiece)
gtest_discover_tests(data_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
add_executable(token_file_tests data/test_token_dataset.cpp)
target_link_libraries(token_file_tests PRIVATE crosstrain_data GTest::gtest_main)
gtest_discover_tests(token_file_tests PROPERTIES LABELS unit TIMEOUT 60 DISCOVERY_TIMEOUT 60)
