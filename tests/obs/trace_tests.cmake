# The recording side of issue 14: flight recorder, hang diagnosis, recording communicator, stragglers, the trace
# writer (unit); and real jobs: traces of a 2-rank and a pp=2 x tp=2 run merged onto one clock, a slowed rank
# named, a clean run without warnings, a held-back collective named by the others' timeout error (train).
add_executable(obs_trace_tests obs/test_obs_logic.cpp)
target_link_libraries(obs_trace_tests PRIVATE crosstrain nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(obs_trace_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)

add_executable(obs_trace_cli_tests obs/test_trace_cli.cpp)
target_include_directories(obs_trace_cli_tests PRIVATE obs train)
target_link_libraries(obs_trace_cli_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
target_compile_definitions(obs_trace_cli_tests PRIVATE
  CT_CROSSTRAIN_BIN="$<TARGET_FILE:crosstrain_app>" CT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_dependencies(obs_trace_cli_tests crosstrain_app)
gtest_discover_tests(obs_trace_cli_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)

# Alone on the machine: a clean run must name no straggler, which only holds when no other test loads the cores.
add_executable(obs_straggler_clean_tests obs/test_straggler_clean.cpp)
target_include_directories(obs_straggler_clean_tests PRIVATE obs train)
target_link_libraries(obs_straggler_clean_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
target_compile_definitions(obs_straggler_clean_tests PRIVATE
  CT_CROSSTRAIN_BIN="$<TARGET_FILE:crosstrain_app>" CT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_dependencies(obs_straggler_clean_tests crosstrain_app)
gtest_discover_tests(obs_straggler_clean_tests PROPERTIES LABELS train TIMEOUT 300 RUN_SERIAL TRUE DISCOVERY_TIMEOUT 60)
