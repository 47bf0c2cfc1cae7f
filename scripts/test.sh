#!/usr/bin/env bash
# Installs what the tests need and runs every test: unit and model-parity
# tests (CTest), then short libFuzzer runs of the parsers. Prints one closing
# line "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."

./scripts/install_deps.sh || exit 1
./scripts/fetch_model.sh || exit 1
./scripts/build.sh -DOSPREY_TESTS=ON || exit 1

passed=0
failed=0
log="$(mktemp)"
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900 2>&1 | tee "$log"
ctest_rc=${PIPESTATUS[0]}
total=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\2/p' "$log" | tail -1)
nfail=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\1/p' "$log" | tail -1)
if [ -z "$total" ]; then
  failed=$((failed + 1))
else
  passed=$((passed + total - nfail))
  failed=$((failed + nfail))
fi
[ "$ctest_rc" -eq 0 ] || [ "$failed" -gt 0 ] || failed=$((failed + 1))

# End-to-end: the server driven by the real openai client (tests/e2e, pytest).
e2e_log="$(mktemp)"
tests/e2e/run.sh 2>&1 | tee "$e2e_log"
e2e_rc=${PIPESTATUS[0]}
e2e_passed=$(grep -Eo '[0-9]+ passed' "$e2e_log" | tail -1 | grep -Eo '[0-9]+')
e2e_failed=$(grep -Eo '[0-9]+ (failed|error)' "$e2e_log" | awk '{s+=$1} END {print s+0}')
passed=$((passed + ${e2e_passed:-0}))
failed=$((failed + ${e2e_failed:-0}))
if [ "$e2e_rc" -ne 0 ] && [ "${e2e_failed:-0}" -eq 0 ]; then failed=$((failed + 1)); fi
rm -f "$e2e_log"

# Fuzz smoke runs: each parser target for a few seconds (OSPREY_FUZZ_SECONDS).
if ./scripts/fuzz.sh "${OSPREY_FUZZ_SECONDS:-20}"; then
  passed=$((passed + 1))
else
  echo "fuzz smoke run failed" >&2
  failed=$((failed + 1))
fi

rm -f "$log"
echo "${passed} passed, ${failed} failed"
[ "$failed" -eq 0 ]
