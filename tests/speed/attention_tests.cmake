# Fused causal attention (issue 15, item 5): forward and gradients against the dense reference at many shapes,
# bf16, causality, no T x T buffer, GPT's logits and loss with either path (label unit).
add_executable(speed_attention_tests speed/test_fused_attention.cpp)
target_link_libraries(speed_attention_tests PRIVATE crosstrain GTest::gtest_main)
gtest_discover_tests(speed_attention_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
