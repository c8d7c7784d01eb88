# The training loop and what it owns (evaluation, checkpoints, metrics rows, the stop vote), config, resume checks.
add_executable(train_tests train/test_loop.cpp)
target_link_libraries(train_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(train_tests PROPERTIES LABELS train TIMEOUT 600 DISCOVERY_TIMEOUT 60)
# Pure logic without communication: config keys and checks, sync.mode as a type.
add_executable(train_unit_tests train/test_train_logic.cpp train/test_sync_mode.cpp train/test_staging_plan.cpp)
target_link_libraries(train_unit_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(train_unit_tests PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)
# Checkpoints and resumes as a user runs them: atomic saves, storage faults, Ctrl-C, another model refused.
add_executable(checkpoint_cli_tests train/test_checkpoint_cli.cpp)
target_link_libraries(checkpoint_cli_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(checkpoint_cli_tests PROPERTIES LABELS train TIMEOUT 600 DISCOVERY_TIMEOUT 60)
add_executable(resume_model_tests train/test_resume_model_cli.cpp)
target_link_libraries(resume_model_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(resume_model_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
# Checkpoints staged between sites without a shared file system, in the background (ranks as threads).
add_executable(site_staging_tests train/test_site_staging.cpp)
target_link_libraries(site_staging_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(site_staging_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
