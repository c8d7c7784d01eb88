# Hugging Face layout in and out (issue 17): export read back by a spec-only safetensors reader, round trips,
# logits of the re-imported model, model.init_from in other layouts, bad inputs.
add_executable(hf_layout_tests ${CMAKE_CURRENT_SOURCE_DIR}/train/test_hf_layout.cpp)
target_include_directories(hf_layout_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/train)
target_link_libraries(hf_layout_tests PRIVATE crosstrain nlohmann_json::nlohmann_json GTest::gtest_main)
target_compile_definitions(hf_layout_tests PRIVATE CT_CROSSTRAIN_BIN="$<TARGET_FILE:crosstrain_app>"
  CT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_dependencies(hf_layout_tests crosstrain_app)
gtest_discover_tests(hf_layout_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
