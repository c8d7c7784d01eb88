# Recommendation models (issue 18), the parts without libtorch: the CTR data sources (synthetic and Criteo TSV),
# the click metrics (AUC, log-loss) and the embedding sharding planner.
add_executable(recsys_pure_tests recsys/test_ctr_data.cpp recsys/test_metrics.cpp recsys/test_sharding_plan.cpp
  recsys/test_dlrm_config.cpp recsys/test_dlrm_identity.cpp)
target_compile_options(recsys_pure_tests PRIVATE -Wall -Wextra)
target_include_directories(recsys_pure_tests PRIVATE ${PROJECT_SOURCE_DIR}/src/data)  # ctr_random.h is private
target_link_libraries(recsys_pure_tests PRIVATE crosstrain_data_pure crosstrain_core_pure crosstrain_recsys_pure
  GTest::gtest_main Threads::Threads)
gtest_discover_tests(recsys_pure_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
