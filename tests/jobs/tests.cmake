# The job families through the one loop. GPT: data parallel against the single-process reference (ranks as
# threads), bf16 in every layout and sync mode, supervised fine-tuning, the MFU denominator's GEMM timer.
add_executable(data_parallel_tests jobs/test_data_parallel.cpp jobs/test_resolve.cpp)
target_link_libraries(data_parallel_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(data_parallel_tests PROPERTIES LABELS train TIMEOUT 600 DISCOVERY_TIMEOUT 60)
add_executable(precision_tests jobs/test_precision.cpp)
target_link_libraries(precision_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(precision_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
add_executable(sft_train_tests jobs/test_sft_train.cpp)
target_link_libraries(sft_train_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(sft_train_tests PROPERTIES LABELS train TIMEOUT 600 DISCOVERY_TIMEOUT 60)
add_executable(peak_flops_tests jobs/test_peak_flops.cpp)
target_include_directories(peak_flops_tests PRIVATE ${PROJECT_SOURCE_DIR}/src/jobs/gpt)  # peak_flops.h is private
target_link_libraries(peak_flops_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(peak_flops_tests PROPERTIES LABELS unit TIMEOUT 60 DISCOVERY_TIMEOUT 60)
# DLRM: every sharding against one process, the parameter-server mode, the recipe as a user runs it.
add_executable(dlrm_tests jobs/test_dlrm_parity.cpp jobs/test_dlrm_ps.cpp)
target_link_libraries(dlrm_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(dlrm_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
add_executable(dlrm_cli_tests jobs/test_dlrm_cli.cpp)
target_link_libraries(dlrm_cli_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(dlrm_cli_tests PROPERTIES LABELS train TIMEOUT 600 DISCOVERY_TIMEOUT 60)
