# Recommendation models' parts without libtorch: click data, AUC, the sharding plan, [dlrm] checks, identity.
add_executable(recsys_pure_tests recsys/test_ctr_data.cpp recsys/test_metrics.cpp recsys/test_sharding_plan.cpp
  recsys/test_dlrm_config.cpp recsys/test_dlrm_identity.cpp)
target_compile_options(recsys_pure_tests PRIVATE -Wall -Wextra)
target_include_directories(recsys_pure_tests PRIVATE ${PROJECT_SOURCE_DIR}/src/data)  # ctr_random.h is private
target_link_libraries(recsys_pure_tests PRIVATE ct_scratch crosstrain_data_pure crosstrain_core_pure crosstrain_recsys_pure
  GTest::gtest_main Threads::Threads)
gtest_discover_tests(recsys_pure_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
# The all-to-all exchange of lookups and gradients, ranks as threads.
add_executable(exchange_tests recsys/test_exchange.cpp)
target_link_libraries(exchange_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(exchange_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
# The sparse parameter server and its worker caches.
add_executable(sparse_ps_tests recsys/test_sparse_param_server.cpp)
target_link_libraries(sparse_ps_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(sparse_ps_tests PROPERTIES LABELS comm TIMEOUT 120 DISCOVERY_TIMEOUT 60)
