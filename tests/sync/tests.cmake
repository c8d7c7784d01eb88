# Synchronization strategies across clusters (sync.mode), ranks as threads.
add_executable(sync_mode_tests sync/test_sync_modes.cpp)
target_link_libraries(sync_mode_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(sync_mode_tests PROPERTIES LABELS train TIMEOUT 600 DISCOVERY_TIMEOUT 60)
# What the sync strategies do (async runs ahead of a slow worker, gossip's pairs, bytes and agreement): ranks as
# threads (label comm); one real `crosstrain train` run with a slow rank (SyncBehaviourCli, label train).
add_executable(sync_behaviour_tests sync/test_sync_behaviour.cpp)
target_link_libraries(sync_behaviour_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(sync_behaviour_tests TEST_FILTER "-SyncBehaviourCli.*"
                     PROPERTIES LABELS comm TIMEOUT 300 DISCOVERY_TIMEOUT 60)
gtest_discover_tests(sync_behaviour_tests TEST_FILTER "SyncBehaviourCli.*"
                     PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
