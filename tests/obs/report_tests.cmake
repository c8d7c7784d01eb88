# The readers of issue 14 (items 1 and 2): trace files and their merge, the trace analysis and the run report.
# Pure logic: the three sources are compiled into the test itself, without libtorch, so its processes start fast.
set(CT_OBS_READER_SOURCES ${PROJECT_SOURCE_DIR}/src/obs/trace_file.cpp ${PROJECT_SOURCE_DIR}/src/obs/trace_analysis.cpp
    ${PROJECT_SOURCE_DIR}/src/obs/report.cpp)
add_executable(obs_report_tests obs/test_trace_file.cpp obs/test_trace_analysis.cpp obs/test_report.cpp
               ${CT_OBS_READER_SOURCES})
target_include_directories(obs_report_tests PRIVATE ${CROSSTRAIN_obs_ROOTS} obs)
target_compile_options(obs_report_tests PRIVATE -Wall -Wextra -Wno-unused-parameter)
target_link_libraries(obs_report_tests PRIVATE crosstrain_core_pure nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(obs_report_tests PROPERTIES LABELS unit TIMEOUT 60 DISCOVERY_TIMEOUT 60)

# The report in headless Chromium (console errors, data-status, screenshots in the build tree), from a made-up run
# and from a real 2-rank `crosstrain train`; `crosstrain report` and `crosstrain trace merge` as a user runs them.
add_executable(obs_report_browser_tests obs/test_report_browser.cpp)
target_include_directories(obs_report_browser_tests PRIVATE obs train)
target_link_libraries(obs_report_browser_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
target_compile_definitions(obs_report_browser_tests PRIVATE
  CT_CROSSTRAIN_BIN="$<TARGET_FILE:crosstrain_app>" CT_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
  CT_SCREENSHOT_DIR="${CMAKE_CURRENT_BINARY_DIR}/obs")
add_dependencies(obs_report_browser_tests crosstrain_app)
gtest_discover_tests(obs_report_browser_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
