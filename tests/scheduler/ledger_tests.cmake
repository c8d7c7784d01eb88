# The ledger of contributed compute (issue 19, docs/ledger.md).
# Without libtorch: keys, the chain, the tamper cases verify refuses, appends, the spot check's logic.
add_executable(ledger_tests ${CMAKE_CURRENT_SOURCE_DIR}/scheduler/test_ledger.cpp)
target_compile_options(ledger_tests PRIVATE -Wall -Wextra)
target_link_libraries(ledger_tests PRIVATE crosstrain_scheduler_pure crosstrain_core_pure GTest::gtest_main Threads::Threads)
gtest_discover_tests(ledger_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
