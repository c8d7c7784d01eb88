# The ledger of contributed compute (issue 19, docs/ledger.md).
# Without libtorch: keys, the chain, the tamper cases verify refuses, appends, the spot check's logic.
add_executable(ledger_tests ${CMAKE_CURRENT_SOURCE_DIR}/scheduler/test_ledger.cpp)
target_compile_options(ledger_tests PRIVATE -Wall -Wextra)
target_link_libraries(ledger_tests PRIVATE crosstrain_ledger_pure crosstrain_core_pure GTest::gtest_main Threads::Threads)
gtest_discover_tests(ledger_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
# With libtorch: the spot check recomputes sampled steps' gradients (a small MLP) and flags the fakers; and
# `crosstrain ledger` run as a user runs it.
add_executable(ledger_torch_tests ${CMAKE_CURRENT_SOURCE_DIR}/scheduler/test_ledger_spot_torch.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/scheduler/test_ledger_cli.cpp)
target_link_libraries(ledger_torch_tests PRIVATE ct_test_support GTest::gtest_main)
target_compile_definitions(ledger_torch_tests PRIVATE CT_CROSSTRAIN_BIN="$<TARGET_FILE:crosstrain_app>")
add_dependencies(ledger_torch_tests crosstrain_app)
gtest_discover_tests(ledger_torch_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
# Claims from training: a run across two clusters writes each cluster's work log (run.work_log), `ledger claim`
# signs it once, `ledger spot-check` passes the honest claims, flags a faker and refuses a tampered ledger.
add_executable(ledger_claim_tests ${CMAKE_CURRENT_SOURCE_DIR}/scheduler/test_ledger_claims.cpp)
target_include_directories(ledger_claim_tests PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/train)  # cli_fixture.h
target_link_libraries(ledger_claim_tests PRIVATE ct_test_support GTest::gtest_main)
target_compile_definitions(ledger_claim_tests PRIVATE CT_CROSSTRAIN_BIN="$<TARGET_FILE:crosstrain_app>"
  CT_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_dependencies(ledger_claim_tests crosstrain_app)
gtest_discover_tests(ledger_claim_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
