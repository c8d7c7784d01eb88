# Included by CTest after every discovered gtest suite (the end of tests/CMakeLists.txt): the cases that carry the
# `slow` label, run by make test-all and not by make test. The collective suites keep world sizes 1-4 and 8 in the
# default run (one rank, odd, a power of two, the largest); sizes 5-7 come here, with the end-to-end compute
# network test (about 4.5 minutes alone). tests/docs/check_slow_tests.sh fails when a name here matches no test.
set_tests_properties([=[WorldSizes/Algorithms.EveryCollectiveMatchesTheReference/ring_np5  # GetParam() = (5, 4-byte object <01-00 00-00>)]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/Algorithms.EveryCollectiveMatchesTheReference/tree_np5  # GetParam() = (5, 4-byte object <02-00 00-00>)]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/Algorithms.EveryCollectiveMatchesTheReference/hd_np5  # GetParam() = (5, 4-byte object <03-00 00-00>)]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/Algorithms.EveryCollectiveMatchesTheReference/hierarchical_np5  # GetParam() = (5, 4-byte object <04-00 00-00>)]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/Algorithms.EveryCollectiveMatchesTheReference/builtin_np5  # GetParam() = (5, 4-byte object <00-00 00-00>)]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/Algorithms.EveryCollectiveMatchesTheReference/ring_np6  # GetParam() = (6, 4-byte object <01-00 00-00>)]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/Algorithms.EveryCollectiveMatchesTheReference/tree_np6  # GetParam() = (6, 4-byte object <02-00 00-00>)]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/Algorithms.EveryCollectiveMatchesTheReference/hd_np6  # GetParam() = (6, 4-byte object <03-00 00-00>)]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/Algorithms.EveryCollectiveMatchesTheReference/hierarchical_np6  # GetParam() = (6, 4-byte object <04-00 00-00>)]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/Algorithms.EveryCollectiveMatchesTheReference/builtin_np6  # GetParam() = (6, 4-byte object <00-00 00-00>)]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/Algorithms.EveryCollectiveMatchesTheReference/ring_np7  # GetParam() = (7, 4-byte object <01-00 00-00>)]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/Algorithms.EveryCollectiveMatchesTheReference/tree_np7  # GetParam() = (7, 4-byte object <02-00 00-00>)]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/Algorithms.EveryCollectiveMatchesTheReference/hd_np7  # GetParam() = (7, 4-byte object <03-00 00-00>)]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/Algorithms.EveryCollectiveMatchesTheReference/hierarchical_np7  # GetParam() = (7, 4-byte object <04-00 00-00>)]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/Algorithms.EveryCollectiveMatchesTheReference/builtin_np7  # GetParam() = (7, 4-byte object <00-00 00-00>)]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/FakeConformance.EveryCollectiveMatchesReference/5]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/FakeConformance.EveryCollectiveMatchesReference/6]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/FakeConformance.EveryCollectiveMatchesReference/7]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/AlgorithmComm.EveryCollectiveMatchesReference/ring_np5  # GetParam() = (5, "ring")]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/AlgorithmComm.EveryCollectiveMatchesReference/tree_np5  # GetParam() = (5, "tree")]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/AlgorithmComm.EveryCollectiveMatchesReference/hd_np5  # GetParam() = (5, "hd")]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/AlgorithmComm.EveryCollectiveMatchesReference/hierarchical_np5  # GetParam() = (5, "hierarchical")]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[WorldSizes/AlgorithmComm.EveryCollectiveMatchesReference/auto_np5  # GetParam() = (5, "auto")]=] PROPERTIES LABELS "comm;slow")
set_tests_properties([=[ComputeNetwork.ADiLoCoJobAcrossThreeSlurmClustersOnEmulatedLinksShrinksAndGrowsLiveAndSurvivesADaemonRestart]=] PROPERTIES LABELS "train;slow")
# Node 0 coming back after the standby's takeover: 40 s alone, and a takeover under the full suite's load is where
# the standby test timed out once (70 s); it runs with the slow ones.
set_tests_properties([=[ElasticCli.TheFirstNodeComesBackIntoTheJobTheStandbyTookOver]=] PROPERTIES LABELS "train;slow")
set_tests_properties([=[ElasticCli.AFirstNodeLeftAloneWithAStandbyElsewhereDoesNotTrainOn]=] PROPERTIES LABELS "train;slow")
set_tests_properties([=[ElasticCli.ANodeStartedAfterTheTakeoverFindsTheJobAtTheStandby]=] PROPERTIES LABELS "train;slow")
set_tests_properties([=[LiveElastic.TheClusterHoldingTheJobsStoreIsLostAndTheJobGoesOnAndTakesItBack]=] PROPERTIES LABELS "train;slow")
set_tests_properties([=[LiveElastic.AShareWhoseClusterStaysDownGrowsOntoAThirdCluster]=] PROPERTIES LABELS "train;slow")
# 1,000 steps that must raise no straggler warning need a quiet machine: on this shared 2-core VM one rank was
# persistently ~1.5x busier than the other in 2 of 3 full runs and 3 of 5 lone runs (2026-12-06), and was rightly
# named. A soak check, like the benchmarks: make test-all runs it.
set_tests_properties([=[Stragglers.NoWarningInAThousandCleanSteps]=] PROPERTIES LABELS "train;slow" RUN_SERIAL TRUE)
# A hundred failures (issue 33, item 5): about 90 s of kills and rejoins; the ten-kill case runs by default.
set_tests_properties([=[ElasticCli.AHundredFailuresLeaveThreadsFilesAndMemoryFlat]=] PROPERTIES LABELS "train;slow")
# A Slurm cluster of two nodes in two testbed hosts (root; about 20 s, serial like every compute network test).
set_tests_properties([=[MultiNodeShare.AJobLargerThanANodeRunsOverTwoNodesOfItsCluster]=] PROPERTIES LABELS "train;slow")
