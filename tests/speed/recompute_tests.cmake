# Activation recomputation (issue 15): bit-identical results in every layout, fewer activation bytes, and the
# allocator's byte counter they are measured with. Ranks are threads (in-process back end).
add_executable(recompute_tests speed/test_recompute.cpp)
target_include_directories(recompute_tests PRIVATE train)
target_link_libraries(recompute_tests PRIVATE crosstrain nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(recompute_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
