# --resume into another model is refused (issue 40): the [model] the checkpoint recorded and its tensors against
# the run's, before any rank starts and in the ranks.
add_executable(resume_model_tests ${CMAKE_CURRENT_SOURCE_DIR}/train/test_resume_model_cli.cpp)
target_include_directories(resume_model_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/train)
target_link_libraries(resume_model_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
target_compile_definitions(resume_model_tests PRIVATE
  CT_CROSSTRAIN_BIN="$<TARGET_FILE:crosstrain_app>" CT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_dependencies(resume_model_tests crosstrain_app)
gtest_discover_tests(resume_model_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
