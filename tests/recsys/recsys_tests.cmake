# DLRM (issue 18): every sharding scheme on 1, 2 and 4 ranks against one process and against an independent
# plain-libtorch reference, resharding on resume, the variable-size all-to-all (ranks as threads); the command
# line end to end (processes).
add_executable(dlrm_tests recsys/test_dlrm_parity.cpp recsys/test_exchange.cpp recsys/test_dlrm_ps.cpp)
target_link_libraries(dlrm_tests PRIVATE crosstrain GTest::gtest_main)
gtest_discover_tests(dlrm_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
add_executable(dlrm_cli_tests recsys/test_dlrm_cli.cpp)
target_link_libraries(dlrm_cli_tests PRIVATE ct_test_support GTest::gtest_main)
target_compile_definitions(dlrm_cli_tests PRIVATE
  CT_CROSSTRAIN_BIN="$<TARGET_FILE:crosstrain_app>" CT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_dependencies(dlrm_cli_tests crosstrain_app)
gtest_discover_tests(dlrm_cli_tests PROPERTIES LABELS train TIMEOUT 600 DISCOVERY_TIMEOUT 60)
