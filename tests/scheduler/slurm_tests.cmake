# The scheduler (issue 19) end to end: the Slurm executor against two real Slurm clusters the test starts
# (scripts/slurm_testbed.sh; root), and the daemon with its HTTP/JSON API.
add_executable(slurm_executor_tests scheduler/test_slurm_executor.cpp)
target_link_libraries(slurm_executor_tests PRIVATE crosstrain_scheduler GTest::gtest_main)
target_compile_definitions(slurm_executor_tests PRIVATE CT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
gtest_discover_tests(slurm_executor_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60 RUN_SERIAL TRUE)
# The daemon and its HTTP/JSON API through `crosstrain scheduler` and `crosstrain job` (real processes).
add_executable(scheduler_cli_tests scheduler/test_scheduler_cli.cpp)
target_link_libraries(scheduler_cli_tests PRIVATE ct_test_support GTest::gtest_main)
target_compile_definitions(scheduler_cli_tests PRIVATE
  CT_CROSSTRAIN_BIN="$<TARGET_FILE:crosstrain_app>" CT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_dependencies(scheduler_cli_tests crosstrain_app)
gtest_discover_tests(scheduler_cli_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
# The compute network end to end: two Slurm clusters, the daemon with the Slurm executor, a real DiLoCo job that
# loses a cluster and survives a daemon restart, the dashboard in Chromium (root; a few minutes).
add_executable(compute_network_tests scheduler/test_compute_network.cpp)
target_link_libraries(compute_network_tests PRIVATE ct_test_support crosstrain_scheduler nlohmann_json::nlohmann_json PkgConfig::HTTPLIB
  GTest::gtest_main)
target_compile_definitions(compute_network_tests PRIVATE
  CT_CROSSTRAIN_BIN="$<TARGET_FILE:crosstrain_app>" CT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_dependencies(compute_network_tests crosstrain_app)
# About 4.5 minutes alone on the machine: labelled `slow` in tests/slow_tests.cmake (make test-all).
gtest_discover_tests(compute_network_tests PROPERTIES LABELS train TIMEOUT 600 DISCOVERY_TIMEOUT 60 RUN_SERIAL TRUE)
