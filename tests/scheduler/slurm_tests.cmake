# The Slurm executor (issue 19) against two real Slurm clusters the test starts (scripts/slurm_testbed.sh; root).
add_executable(slurm_executor_tests scheduler/test_slurm_executor.cpp)
target_link_libraries(slurm_executor_tests PRIVATE crosstrain_scheduler GTest::gtest_main)
target_compile_definitions(slurm_executor_tests PRIVATE CT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
gtest_discover_tests(slurm_executor_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60 RUN_SERIAL TRUE)
