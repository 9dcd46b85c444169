#!/usr/bin/env bash
# tests/scripts/run_gtest_suite.py against a made-up GoogleTest binary whose tests pass,
# fail, skip, crash the process or leak at exit on demand: every test gets its result
# after a crash (the rest run in a fresh process), a failure or a failing exit fails the
# suite, and a suite of skipped tests is skipped (77). Usage: run_gtest_suite_test.sh RUNNER
set -euo pipefail
runner="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
# The fake binary: its tests are named by what they do (Ok*, Fail*, Skip*, Crash*); a
# suite named Leaky exits 23 after its tests, as LeakSanitizer does.
cat > "$dir/fake_tests" <<'FAKE'
#!/usr/bin/env python3
import sys
args = dict(a.split("=", 1) if "=" in a else (a, "") for a in sys.argv[1:])
names = args["--gtest_filter"].split(":")
for name in names:
    suite, test = name.split(".")
    print(f"[ RUN      ] {name}", flush=True)
    if test.startswith("Crash"):
        print("AddressSanitizer: planted", flush=True)
        sys.exit(134)
    result = {"Ok": "[       OK ]", "Fa": "[  FAILED  ]", "Sk": "[  SKIPPED ]"}[test[:2]]  # GoogleTest's tags
    print(f"{result} {name} (0 ms)", flush=True)
print("[==========] done", flush=True)
sys.exit(23 if names[0].startswith("Leaky") else int(any(".Fail" in n for n in names)))
FAKE
chmod +x "$dir/fake_tests"
declare -A tests=([Mixed]="OkA CrashB OkC FailD CrashE OkF" [Skipping]="SkipA SkipB" [Leaky]="OkA" [Fine]="OkA SkipB")
expect() {  # expect SUITE STATUS PATTERN...: the runner's exit status and lines in its output
  local suite="$1" want="$2" got=0 out names=()
  shift 2
  for t in ${tests[$suite]}; do names+=("$suite.$t"); done
  out="$(python3 "$runner" "$dir/fake_tests" "${names[@]}")" || got=$?
  [ "$got" = "$want" ] || { echo "$out"; echo "FAIL: $suite: exit status $got, expected $want"; exit 1; }
  for pattern in "$@"; do
    grep -qE -- "$pattern" <<<"$out" || { echo "$out"; echo "FAIL: $suite: no line matching '$pattern'"; exit 1; }
  done
}
expect Mixed 1 "Mixed: 3 passed, 0 skipped, 3 failed of 6" "Mixed.CrashB: CRASHED" "Mixed.FailD: FAILED" \
  "Mixed.CrashE: CRASHED" "^\[       OK \] Mixed.OkF"
expect Skipping 77 "Skipping: 0 passed, 2 skipped, 0 failed of 2"
expect Leaky 1 "a process of Leaky failed after its tests \(exit status 23\)"
expect Fine 0 "Fine: 1 passed, 1 skipped, 0 failed of 2"
echo "ok: every test reported after crashes; failures, failing exits and all-skipped suites told apart"
