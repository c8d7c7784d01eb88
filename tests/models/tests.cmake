# Models: fused attention against the reference, activation recompute, seeded shard-only initialisation. Pure
# tests (model identity, the parallel plan) are in models/pure/.
add_executable(speed_attention_tests models/test_fused_attention.cpp)
target_link_libraries(speed_attention_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(speed_attention_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
add_executable(recompute_tests models/test_recompute.cpp)
target_link_libraries(recompute_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(recompute_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
add_executable(speed_init_memory_tests models/test_shard_init.cpp)
target_link_libraries(speed_init_memory_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(speed_init_memory_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
