# The rendezvous store: in one process, and hosted by a real launcher under hostile clients. Its pure tests
# (address, auth, protocol, table) are in store/pure/.
add_executable(store_tests store/test_store.cpp store/test_store_processes.cpp)
target_link_libraries(store_tests PRIVATE ct_test_support GTest::gtest_main)
target_compile_definitions(store_tests PRIVATE CT_WORKER_BIN="$<TARGET_FILE:comm_worker>")
add_dependencies(store_tests comm_worker)
gtest_discover_tests(store_tests PROPERTIES LABELS comm TIMEOUT 300 DISCOVERY_TIMEOUT 60)
