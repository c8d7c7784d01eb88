# The planner (issue 16): formulas against hand-computed cases, the cluster file, the search, the replay.
file(GLOB PLANNER_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/planner/test_*.cpp)
add_executable(planner_tests ${PLANNER_TEST_SOURCES})
target_link_libraries(planner_tests PRIVATE crosstrain_planner GTest::gtest_main)
target_compile_definitions(planner_tests PRIVATE CROSSTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
  CROSSTRAIN_BINARY="$<TARGET_FILE:crosstrain_app>")
add_dependencies(planner_tests crosstrain_app)
gtest_discover_tests(planner_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
include(${CMAKE_CURRENT_SOURCE_DIR}/planner/calibrate_tests.cmake)
