# The ledger of contributed compute (issue 19, docs/ledger.md).
# Without libtorch: keys, the chain, the tamper cases verify refuses, appends, the spot check's logic.
add_executable(ledger_tests ledger/test_ledger.cpp)
target_compile_options(ledger_tests PRIVATE -Wall -Wextra)
target_link_libraries(ledger_tests PRIVATE crosstrain_ledger_pure crosstrain_core_pure ct_support GTest::gtest_main)
gtest_discover_tests(ledger_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
# With libtorch: the spot check recomputes sampled steps' gradients (a small MLP) and flags the fakers; and
# `crosstrain ledger` run as a user runs it.
add_executable(ledger_torch_tests ledger/test_ledger_spot_torch.cpp ledger/test_ledger_cli.cpp)
target_link_libraries(ledger_torch_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(ledger_torch_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
# Claims from training: a run across two clusters writes each cluster's work log (run.work_log), `ledger claim`
# signs it once, `ledger spot-check` passes the honest claims, flags a faker and refuses a tampered ledger.
add_executable(ledger_claim_tests ledger/test_ledger_claims.cpp)
target_link_libraries(ledger_claim_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(ledger_claim_tests PROPERTIES LABELS unit TIMEOUT 120 DISCOVERY_TIMEOUT 60)
