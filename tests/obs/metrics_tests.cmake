# Live metrics and the MFU denominator (issue 14): the Prometheus text, the endpoint over a real socket, the GEMM
# shapes timed for a model (label unit); the endpoint scraped while a real 2-rank `crosstrain train` runs (train).
add_executable(obs_metrics_tests obs/test_prometheus_text.cpp obs/test_metrics_server.cpp obs/test_peak_flops.cpp)
target_include_directories(obs_metrics_tests PRIVATE obs ${PROJECT_SOURCE_DIR}/src/jobs/gpt)  # peak_flops.h is private
target_link_libraries(obs_metrics_tests PRIVATE crosstrain GTest::gtest_main)
gtest_discover_tests(obs_metrics_tests PROPERTIES LABELS unit TIMEOUT 60 DISCOVERY_TIMEOUT 60)

add_executable(obs_metrics_cli_tests obs/test_metrics_cli.cpp)
target_include_directories(obs_metrics_cli_tests PRIVATE obs train)
target_link_libraries(obs_metrics_cli_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
target_compile_definitions(obs_metrics_cli_tests PRIVATE
  CT_CROSSTRAIN_BIN="$<TARGET_FILE:crosstrain_app>" CT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_dependencies(obs_metrics_cli_tests crosstrain_app)
gtest_discover_tests(obs_metrics_cli_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
