# The sparse parameter server and the worker's row cache (issue 18, item 4): ranks as threads over the in-process
# back end; pulls, pushes against one whole table, mmap storage, staleness and eviction, failures within a timeout.
add_executable(sparse_ps_tests ${CMAKE_CURRENT_SOURCE_DIR}/recsys/test_sparse_param_server.cpp)
target_link_libraries(sparse_ps_tests PRIVATE crosstrain GTest::gtest_main)
gtest_discover_tests(sparse_ps_tests PROPERTIES LABELS comm TIMEOUT 120 DISCOVERY_TIMEOUT 60)
