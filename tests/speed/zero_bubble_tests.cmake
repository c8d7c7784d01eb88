# Zero-bubble pipelines (issue 15): the weight-gradient store against autograd (unit); pipelines whose weight
# actions use it against 1F1B and the single-process reference are in parallel_tests (test_layouts.cpp).
add_executable(zero_bubble_tests speed/test_weight_grad_store.cpp)
target_link_libraries(zero_bubble_tests PRIVATE crosstrain GTest::gtest_main)
gtest_discover_tests(zero_bubble_tests PROPERTIES LABELS unit TIMEOUT 60 DISCOVERY_TIMEOUT 60)
