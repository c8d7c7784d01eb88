# DLRM (issue 18): every sharding scheme on 1, 2 and 4 ranks against one process and against an independent
# plain-libtorch reference, resharding on resume, the variable-size all-to-all (ranks as threads); the command
# line end to end (processes).
add_executable(dlrm_tests recsys/test_dlrm_parity.cpp recsys/test_exchange.cpp)
target_link_libraries(dlrm_tests PRIVATE crosstrain GTest::gtest_main)
gtest_discover_tests(dlrm_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
