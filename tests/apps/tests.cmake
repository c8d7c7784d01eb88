# The crosstrain commands: their pure parts (crosstrain_cli), `crosstrain train` and `run` as a user runs them,
# the launcher against the machine's limits, the planner's calibration of this host.
add_executable(apps_unit_tests apps/test_cli_logic.cpp)
target_link_libraries(apps_unit_tests PRIVATE ct_test_support crosstrain_cli GTest::gtest_main)
gtest_discover_tests(apps_unit_tests PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)
add_executable(train_cli_tests apps/test_train_cli.cpp apps/test_secret_cli.cpp apps/test_config_cli.cpp
                               apps/test_readme_commands.cpp)
target_link_libraries(train_cli_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
gtest_discover_tests(train_cli_tests PROPERTIES LABELS train TIMEOUT 600 DISCOVERY_TIMEOUT 60)
# SIGKILLed launcher, failed fork (pids cgroup), --nproc checks.
add_executable(launcher_tests apps/test_launcher_limits.cpp)
target_link_libraries(launcher_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(launcher_tests PROPERTIES LABELS comm TIMEOUT 300 DISCOVERY_TIMEOUT 60)
add_executable(calibrate_tests apps/test_plan_calibrate.cpp)
target_include_directories(calibrate_tests PRIVATE ${PROJECT_SOURCE_DIR}/src/apps)
target_link_libraries(calibrate_tests PRIVATE ct_test_support crosstrain_cli GTest::gtest_main)
gtest_discover_tests(calibrate_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
