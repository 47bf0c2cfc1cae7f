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
