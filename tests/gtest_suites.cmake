# Read by ctest (TEST_INCLUDE_FILES) where hp_tests runs a process per suite
# (HP_GTEST_PROCESS_PER_SUITE): one test per GoogleTest suite, named by the suite, each run
# by tests/scripts/run_gtest_suite.py, which keeps a crashing test from hiding the rest.
# Listed when ctest starts, as gtest_discover_tests' PRE_TEST mode lists single tests.
# Set by the file the build generates before including this one: hp_tests_binary,
# hp_suite_runner. Leaves hp_gtest_suites and hp_suite_tests_<suite> (its number of tests)
# for test_costs.cmake.
if(NOT EXISTS "${hp_tests_binary}")
  add_test(hp_tests_NOT_BUILT hp_tests_NOT_BUILT)
  return()
endif()
execute_process(COMMAND "${hp_tests_binary}" --gtest_list_tests --gtest_also_run_disabled_tests
                OUTPUT_VARIABLE listing RESULT_VARIABLE listed TIMEOUT 120)
if(NOT listed EQUAL 0)
  message(FATAL_ERROR "${hp_tests_binary} --gtest_list_tests failed (${listed}):\n${listing}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(hp_gtest_suites "")
foreach(line IN LISTS lines)
  # Suite lines start in column 0 and end with '.' (a "# TypeParam" comment may follow);
  # test lines are indented (a "# GetParam()" comment may follow the name).
  if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
    set(suite "${CMAKE_MATCH_1}")
    list(APPEND hp_gtest_suites "${suite}")
    set(hp_suite_names_${suite} "")
  elseif(line MATCHES "^  ([^ ]+)" AND DEFINED suite)
    list(APPEND hp_suite_names_${suite} "${suite}.${CMAKE_MATCH_1}")
  endif()
endforeach()
foreach(suite IN LISTS hp_gtest_suites)
  # The runner gets the suite's tests by name: listing them again would start the binary
  # once more per suite (~1.1 s under ASan).
  add_test("${suite}" python3 "${hp_suite_runner}" "${hp_tests_binary}" ${hp_suite_names_${suite}})
  # A suite's tests one after the other: each test's 300 s, a few of them.
  set_tests_properties("${suite}" PROPERTIES TIMEOUT 900 SKIP_RETURN_CODE 77)
  list(LENGTH hp_suite_names_${suite} hp_suite_tests_${suite})
endforeach()
