#!/usr/bin/env python3
"""Runs the named tests of a GoogleTest binary (one suite's, as ctest calls it) in one process.

    run_gtest_suite.py BINARY SUITE.TEST...

ctest runs this once per suite, with the suite's tests as tests/gtest_suites.cmake listed
them, where the build asks for a process per suite (HP_GTEST_PROCESS_PER_SUITE, on in the
sanitizer build): there, a process costs about a
second of LibTorch's start-up under ASan and of the leak check at its exit, a third of
that suite's time when every test had its own. A test that crashes the process (a signal,
an ASan or UBSan report, an abort) does not hide the tests after it: the runner names it
as failed and runs the suite's remaining tests in a fresh process, until every test has a
result. A process that fails after its tests passed (a leak found at exit) fails the suite.

Prints each process's output as it comes, then one line per test that did not pass.
Exit status: 0 when every test passed or skipped and at least one passed, 77 when every
test skipped (ctest's SKIP_RETURN_CODE), 1 otherwise.
"""
import re
import subprocess
import sys

RESULT = re.compile(r"^\[ +(OK|FAILED|SKIPPED) +\] (\S+)")
RUN = re.compile(r"^\[ RUN +\] (\S+)")


def run_once(binary, names):
    """Runs `names` in one process; returns ({name: result}, crashed test or None, rc)."""
    results, running = {}, None
    cmd = [binary, "--gtest_filter=" + ":".join(names), "--gtest_also_run_disabled_tests"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace") as p:
        for line in p.stdout:
            sys.stdout.write(line)
            m = RUN.match(line)
            if m:
                running = m.group(1)
                continue
            m = RESULT.match(line)
            if m and m.group(2) in names and m.group(2) not in results:
                results[m.group(2)] = m.group(1)
                if m.group(2) == running:
                    running = None
        rc = p.wait()
    sys.stdout.flush()
    return results, running, rc


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    binary, names = sys.argv[1], sys.argv[2:]
    suite = names[0].split(".")[0]
    results, remaining, process_failures = {}, list(names), []
    while remaining:
        got, crashed, rc = run_once(binary, remaining)
        results.update(got)
        if crashed:
            results[crashed] = f"CRASHED (exit status {rc})"
        elif rc not in (0, 1) or (rc == 1 and all(got.get(n) in ("OK", "SKIPPED") for n in remaining)):
            process_failures.append(rc)
        left = [n for n in remaining if n not in results]
        if left and not crashed:
            # The process ended between tests (or before the first): name the first that
            # never ran and go on after it, so that the loop always makes progress.
            results[left[0]] = f"NOT RUN: the process ended first (exit status {rc})"
            left = left[1:]
        if left:
            print(f"run_gtest_suite: {len(left)} test(s) of {suite} left after the process ended; "
                  "running them in a fresh one", flush=True)
        remaining = left
    bad = [(n, r) for n, r in results.items() if r not in ("OK", "SKIPPED")]
    passed = sum(r == "OK" for r in results.values())
    print(f"run_gtest_suite: {suite}: {passed} passed, "
          f"{sum(r == 'SKIPPED' for r in results.values())} skipped, {len(bad)} failed of {len(names)}")
    for name, result in bad:
        print(f"run_gtest_suite:   {name}: {result}")
    for rc in process_failures:
        print(f"run_gtest_suite:   a process of {suite} failed after its tests (exit status {rc})")
    if bad or process_failures:
        return 1
    return 0 if passed else 77


if __name__ == "__main__":
    sys.exit(main())
