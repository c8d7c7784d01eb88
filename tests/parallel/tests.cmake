# Model parallelism: mesh, tensor/sequence parallel, pipeline, ZeRO, resharding, fine-tuning, against the
# single-device reference. Its pure tests (mesh shape, schedules) are in parallel/pure/.
file(GLOB PARALLEL_TEST_SOURCES CONFIGURE_DEPENDS parallel/test_*.cpp)
list(REMOVE_ITEM PARALLEL_TEST_SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/parallel/test_weight_grad_store.cpp)
add_executable(parallel_tests ${PARALLEL_TEST_SOURCES})
target_link_libraries(parallel_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(parallel_tests PROPERTIES LABELS comm TIMEOUT 600 DISCOVERY_TIMEOUT 60)
# Zero-bubble pipelines: the weight-gradient store.
add_executable(zero_bubble_tests parallel/test_weight_grad_store.cpp)
target_link_libraries(zero_bubble_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(zero_bubble_tests PROPERTIES LABELS unit TIMEOUT 60 DISCOVERY_TIMEOUT 60)
