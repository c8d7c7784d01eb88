# Shard-only initialisation and ZeRO-3 memory (issue 15, item 3): stages draw their shards of the seeded model bit
# for bit, building a tensor-parallel rank allocates its shards plus one full parameter, and ZeRO stages lower the
# peak bytes a rank allocates (counted by the allocator, not RSS). Ranks are threads.
add_executable(speed_init_memory_tests speed/test_shard_init.cpp)
target_include_directories(speed_init_memory_tests PRIVATE train)
target_link_libraries(speed_init_memory_tests PRIVATE crosstrain GTest::gtest_main)
gtest_discover_tests(speed_init_memory_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
