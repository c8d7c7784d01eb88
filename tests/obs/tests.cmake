# Observability (issue 14): traces, the run report, stragglers, hang diagnosis, live metrics. One target per part.
add_executable(obs_trace_tests obs/test_obs_logic.cpp)
target_link_libraries(obs_trace_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(obs_trace_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
add_executable(obs_trace_cli_tests obs/test_trace_cli.cpp)
target_link_libraries(obs_trace_cli_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(obs_trace_cli_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
add_executable(obs_straggler_clean_tests obs/test_straggler_clean.cpp)
target_link_libraries(obs_straggler_clean_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(obs_straggler_clean_tests PROPERTIES LABELS train TIMEOUT 300 RUN_SERIAL TRUE DISCOVERY_TIMEOUT 60)

# The trace reader and the report without libtorch: obs' own sources, compiled here.
set(CT_OBS_READER_SOURCES ${PROJECT_SOURCE_DIR}/src/obs/trace_file.cpp ${PROJECT_SOURCE_DIR}/src/obs/trace_analysis.cpp
    ${PROJECT_SOURCE_DIR}/src/obs/report.cpp)
add_executable(obs_report_tests obs/test_trace_file.cpp obs/test_trace_analysis.cpp obs/test_report.cpp
               ${CT_OBS_READER_SOURCES})
target_include_directories(obs_report_tests PRIVATE ${CROSSTRAIN_obs_ROOTS} support)
target_compile_options(obs_report_tests PRIVATE -Wall -Wextra -Wno-unused-parameter)
target_link_libraries(obs_report_tests PRIVATE ct_scratch crosstrain_core_pure nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(obs_report_tests PROPERTIES LABELS unit TIMEOUT 60 DISCOVERY_TIMEOUT 60)
# The report in headless Chromium; the screenshots stay in the build tree.
add_executable(obs_report_browser_tests obs/test_report_browser.cpp)
target_link_libraries(obs_report_browser_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
target_compile_definitions(obs_report_browser_tests PRIVATE CT_SCREENSHOT_DIR="${CMAKE_CURRENT_BINARY_DIR}/obs")
gtest_discover_tests(obs_report_browser_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)

# Live metrics: the Prometheus text, the endpoint over a real socket (unit); the endpoint scraped while a real
# 2-rank `crosstrain train` runs (train).
add_executable(obs_metrics_tests obs/test_prometheus_text.cpp obs/test_metrics_server.cpp)
target_link_libraries(obs_metrics_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(obs_metrics_tests PROPERTIES LABELS unit TIMEOUT 60 DISCOVERY_TIMEOUT 60)
add_executable(obs_metrics_cli_tests obs/test_metrics_cli.cpp)
target_link_libraries(obs_metrics_cli_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(obs_metrics_cli_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
