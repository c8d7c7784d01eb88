# bf16 everywhere (issue 15, item 4): every sync mode in bf16 against fp32, and the parts that stay fp32 (the
# reduced gradients, their norm, the loss). Ranks are threads; about 20 s in all.
add_executable(precision_tests speed/test_precision.cpp)
target_include_directories(precision_tests PRIVATE train)
target_link_libraries(precision_tests PRIVATE crosstrain nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(precision_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
