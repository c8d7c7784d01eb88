# Ranks as threads over the in-process back end.
add_executable(comm_fake_tests comm/test_fake_comm.cpp comm/test_compressed_allreduce.cpp comm/test_algorithm_comm.cpp
               comm/test_param_server_core.cpp comm/test_sealed_comm.cpp)
target_link_libraries(comm_fake_tests PRIVATE ct_test_support PkgConfig::SODIUM GTest::gtest_main)
gtest_discover_tests(comm_fake_tests PROPERTIES LABELS comm TIMEOUT 300 DISCOVERY_TIMEOUT 60)
# Pure logic without communication: gradient codecs, the cost model.
add_executable(comm_unit_tests comm/test_compression.cpp comm/test_cost_model.cpp)
target_link_libraries(comm_unit_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(comm_unit_tests PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)

# Real processes over loopback.
add_executable(comm_worker comm/comm_worker.cpp)
target_link_libraries(comm_worker PRIVATE ct_test_support)
add_executable(process_tests comm/test_processes.cpp)
target_link_libraries(process_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
target_compile_definitions(process_tests PRIVATE CT_WORKER_BIN="$<TARGET_FILE:comm_worker>")
add_dependencies(process_tests comm_worker)
gtest_discover_tests(process_tests PROPERTIES LABELS comm TIMEOUT 300 DISCOVERY_TIMEOUT 60)

# The MPI back end: the same suite under mpirun.
if(MPI_CXX_FOUND AND MPIEXEC_EXECUTABLE)
  foreach(n 2 3)
    add_test(NAME mpi_conformance_np${n}
             COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np ${n} -x CT_BACKEND=mpi
                     $<TARGET_FILE:comm_worker> conformance)
    set_tests_properties(mpi_conformance_np${n} PROPERTIES LABELS comm TIMEOUT 600)
  endforeach()
endif()

foreach(n 2 3 4)
  add_test(NAME gloo_conformance_np${n}
           COMMAND $<TARGET_FILE:crosstrain_app> run --nproc ${n} -- $<TARGET_FILE:comm_worker> conformance)
  set_tests_properties(gloo_conformance_np${n} PROPERTIES LABELS comm TIMEOUT 600)
endforeach()

# The same suite through sealed messages (comm.encrypt = "all") over Gloo.
add_test(NAME gloo_sealed_conformance_np3
         COMMAND $<TARGET_FILE:crosstrain_app> run --nproc 3 -- $<TARGET_FILE:comm_worker> conformance)
set_tests_properties(gloo_sealed_conformance_np3 PROPERTIES LABELS comm TIMEOUT 600
                     ENVIRONMENT "CT_ENCRYPT=all;CROSSTRAIN_SECRET=conformance-secret-0123456789abcdef"
                     PASS_REGULAR_EXPRESSION "conformance passed on 3 ranks \\(sealed\\)")

# Collective algorithms of our own (ring, tree, halving-doubling, hierarchical), ranks as threads.
add_executable(comm_algo_tests comm/test_algorithms.cpp comm/algorithm_checks.cpp)
target_link_libraries(comm_algo_tests PRIVATE ct_test_support GTest::gtest_main)
gtest_discover_tests(comm_algo_tests PROPERTIES LABELS comm TIMEOUT 300 DISCOVERY_TIMEOUT 60)
# The same checks over Gloo in real processes.
add_executable(algorithm_worker comm/algorithm_worker.cpp comm/algorithm_checks.cpp)
target_link_libraries(algorithm_worker PRIVATE ct_test_support)
foreach(n 3 4)
  add_test(NAME gloo_algorithms_np${n}
           COMMAND $<TARGET_FILE:crosstrain_app> run --nproc ${n} -- $<TARGET_FILE:algorithm_worker>)
  set_tests_properties(gloo_algorithms_np${n} PROPERTIES LABELS comm TIMEOUT 600)
endforeach()

# A stopped rank is reported within one timeout on every communication path (real jobs; mpirun too): the hang
# doctor and the flight recorder (comm/diagnostics).
add_executable(hung_rank_tests comm/test_hung_rank.cpp)
target_link_libraries(hung_rank_tests PRIVATE ct_test_support nlohmann_json::nlohmann_json GTest::gtest_main)
if(MPI_CXX_FOUND AND MPIEXEC_EXECUTABLE)
  target_compile_definitions(hung_rank_tests PRIVATE CT_MPIEXEC="${MPIEXEC_EXECUTABLE}")
endif()
gtest_discover_tests(hung_rank_tests PROPERTIES LABELS train TIMEOUT 300 DISCOVERY_TIMEOUT 60)
