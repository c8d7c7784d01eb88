# The scheduler's resource, control and state core (issue 19, docs/scheduler.md): placement against hand-worked
# cases, the SQLite state and its recovery, the gang scheduler over the simulated executor, the bench's smoke run.
add_executable(scheduler_tests
  ${CMAKE_CURRENT_SOURCE_DIR}/scheduler/test_placement.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/scheduler/test_state_store.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/scheduler/test_gang_scheduler.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/scheduler/test_train_share.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/scheduler/test_local_executor.cpp)
target_compile_options(scheduler_tests PRIVATE -Wall -Wextra -Wno-unused-parameter)
target_link_libraries(scheduler_tests PRIVATE crosstrain_scheduler SQLite::SQLite3 GTest::gtest_main)
gtest_discover_tests(scheduler_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
# The service's view of each job's run folder: live metrics, the report, /chart.js, and the dashboard showing a
# selected job's metrics in headless Chromium (an executor with hand-written run folders; no training).
add_executable(scheduler_service_tests ${CMAKE_CURRENT_SOURCE_DIR}/scheduler/test_service_run.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/support/subprocess.cpp)
target_include_directories(scheduler_service_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/support)
target_compile_options(scheduler_service_tests PRIVATE -Wall -Wextra -Wno-unused-parameter)
target_link_libraries(scheduler_service_tests PRIVATE crosstrain_scheduler SQLite::SQLite3 PkgConfig::HTTPLIB
  nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(scheduler_service_tests PROPERTIES LABELS unit TIMEOUT 240 DISCOVERY_TIMEOUT 60)
