# Elastic membership's coordinator against an in-process store (the test plays the ranks); membership logic is in
# elastic/pure/.
add_executable(elastic_tests elastic/test_coordinator.cpp elastic/test_abortable.cpp elastic/test_step_voter.cpp)
target_link_libraries(elastic_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(elastic_tests PROPERTIES LABELS unit TIMEOUT 60 DISCOVERY_TIMEOUT 60)
# Elastic training: kills, stops and restarts of real ranks under a real launcher (issue 13).
add_executable(elastic_cli_tests elastic/test_elastic.cpp)
target_link_libraries(elastic_cli_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(elastic_cli_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
