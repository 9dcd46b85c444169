# Read by ctest after hp_tests' tests are discovered (TEST_INCLUDE_FILES): the longest of
# them get a COST, their seconds on the project's 2-core machine, so that ctest -j starts
# them first (the script-driven tests get theirs in CMakeLists.txt). Where hp_tests runs a
# process per suite (tests/gtest_suites.cmake), the suite gets the sum of its tests' costs.
# A fresh clone has no timing history (Testing/Temporary/CTestCostData.txt); without these,
# a long test that happens to start last runs alone at the end and stretches the suite.
foreach(entry
    OpConformance.EveryCaseOnAMeshOf3MatchesOneProcessOrRefusesOnEveryRank=48
    CheckpointVerify.ACrashAtAnyPointOfASaveLeavesLatestOnAVerifiedStep=45
    HfExport.TransformersLoadsTheExportWithTheSameLogitsAtTP1And2=43
    OpConformance.EveryOddCaseOnA2x2MeshMatchesOneProcessOrRefusesOnEveryRank=37
    OpConformance.EveryEvenCaseOnA2x2MeshMatchesOneProcessOrRefusesOnEveryRank=35
    FusedCrossEntropy.ZLossAndSoftcapMatchTheFloat64DefinitionAtEveryDegree=26
    LossAccuracy.EveryLossPathIsWithinTwiceAtensErrorInItsDtypeAtEveryLogitScale=25
    FusedLinearCrossEntropy.MatchesTheFloat64DefinitionForEveryOptionAtTp1To4=25
    Trainer.SequenceParallelTrainsAsTp1=23)
  string(REPLACE "=" ";" pair "${entry}")
  list(GET pair 0 name)
  list(GET pair 1 seconds)
  if(TEST "${name}")
    set_tests_properties("${name}" PROPERTIES COST "${seconds}")
  else()
    string(REGEX REPLACE "\\..*$" "" suite "${name}")
    list(APPEND slow_tests_of_${suite} "${seconds}")
  endif()
endforeach()
# A suite run as one process: a second per test (a test's start-up and work under ASan,
# roughly) plus the listed costs of its slow tests.
foreach(suite IN LISTS hp_gtest_suites)
  set(cost "${hp_suite_tests_${suite}}")
  foreach(seconds IN LISTS slow_tests_of_${suite})
    math(EXPR cost "${cost} + ${seconds}")
  endforeach()
  set_tests_properties("${suite}" PROPERTIES COST "${cost}")
endforeach()
