# `crosstrain plan --calibrate` (issue 16, item 3): the description of a host from made-up measurements, and one
# quick real calibration (a few seconds) read back through the cluster file. Needs the apps' code and libtorch,
# hence its own executable (planner_tests links the pure planner only).
add_executable(calibrate_tests ${CMAKE_CURRENT_SOURCE_DIR}/planner/calibrate_host.cpp)
target_include_directories(calibrate_tests PRIVATE ${PROJECT_SOURCE_DIR}/src/apps)
target_link_libraries(calibrate_tests PRIVATE crosstrain_cli GTest::gtest_main)
gtest_discover_tests(calibrate_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
