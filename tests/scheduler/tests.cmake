# The scheduler (issue 19): placement, its SQLite state, the gang scheduler, the train shares, local executors.
add_executable(scheduler_tests scheduler/test_placement.cpp scheduler/test_state_store.cpp
  scheduler/test_gang_scheduler.cpp scheduler/test_train_share.cpp scheduler/test_local_executor.cpp
  scheduler/test_api_auth.cpp)
target_compile_options(scheduler_tests PRIVATE -Wall -Wextra -Wno-unused-parameter)
target_link_libraries(scheduler_tests PRIVATE crosstrain_scheduler ct_support SQLite::SQLite3 PkgConfig::SODIUM
  GTest::gtest_main)
gtest_discover_tests(scheduler_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
# The HTTP API and dashboard of a running service.
add_executable(scheduler_service_tests scheduler/test_service_run.cpp)
target_compile_options(scheduler_service_tests PRIVATE -Wall -Wextra -Wno-unused-parameter)
target_link_libraries(scheduler_service_tests PRIVATE crosstrain_scheduler ct_support SQLite::SQLite3 PkgConfig::HTTPLIB
  PkgConfig::SODIUM
  nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(scheduler_service_tests PROPERTIES LABELS unit TIMEOUT 240 DISCOVERY_TIMEOUT 60)
# Real Slurm clusters (scripts/slurm_testbed.sh), the CLI, and the compute network end to end.
add_executable(slurm_executor_tests scheduler/test_slurm_executor.cpp)
target_link_libraries(slurm_executor_tests PRIVATE crosstrain_scheduler ct_support GTest::gtest_main)
target_compile_definitions(slurm_executor_tests PRIVATE CT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
gtest_discover_tests(slurm_executor_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60 RUN_SERIAL TRUE)
add_executable(scheduler_cli_tests scheduler/test_scheduler_cli.cpp)
target_link_libraries(scheduler_cli_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(scheduler_cli_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
add_executable(compute_network_tests scheduler/test_compute_network.cpp)
target_link_libraries(compute_network_tests PRIVATE ct_test_support crosstrain_scheduler nlohmann_json::nlohmann_json
  PkgConfig::HTTPLIB GTest::gtest_main)
gtest_discover_tests(compute_network_tests PROPERTIES LABELS train TIMEOUT 600 DISCOVERY_TIMEOUT 60 RUN_SERIAL TRUE)
# Live shrink and grow of a real DiLoCo job across two local clusters (issue 35).
add_executable(live_elastic_tests scheduler/test_live_elastic.cpp)
target_link_libraries(live_elastic_tests PRIVATE ct_test_support crosstrain_scheduler nlohmann_json::nlohmann_json
  GTest::gtest_main)
gtest_discover_tests(live_elastic_tests PROPERTIES LABELS train TIMEOUT 400 DISCOVERY_TIMEOUT 60 RUN_SERIAL TRUE)
