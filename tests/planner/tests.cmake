# The planner (issue 16): formulas against hand-computed cases, the cluster file, the search, the replay, and
# `crosstrain plan` run as a user runs it (through ct_support's shell runner, with a deadline).
file(GLOB PLANNER_TEST_SOURCES CONFIGURE_DEPENDS planner/test_*.cpp)
add_executable(planner_tests ${PLANNER_TEST_SOURCES})
target_link_libraries(planner_tests PRIVATE crosstrain_planner ct_support GTest::gtest_main)
target_compile_definitions(planner_tests PRIVATE CROSSTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
  CROSSTRAIN_BINARY="$<TARGET_FILE:crosstrain_app>")
add_dependencies(planner_tests crosstrain_app)
gtest_discover_tests(planner_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
