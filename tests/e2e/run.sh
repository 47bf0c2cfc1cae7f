#!/usr/bin/env bash
# End-to-end tests of `osprey serve` with the real OpenAI client.
# Creates (or reuses) the venv .venv-test with tests/e2e/requirements.txt,
# then runs pytest on tests/e2e. The server binary is $OSPREY_BIN, else
# $OSPREY_BUILD_DIR/tools/osprey (default build/tools/osprey); the default
# model must be fetched (scripts/fetch_model.sh). Extra arguments go to pytest.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${OSPREY_TEST_VENV:-$repo/.venv-test}"
req="$repo/tests/e2e/requirements.txt"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
fi
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req"
  echo "$want" > "$stamp"
fi
bin="${OSPREY_BIN:-$repo/${OSPREY_BUILD_DIR:-build}/tools/osprey}"
if [[ ! -x "$bin" ]]; then
  echo "tests/e2e/run.sh: no osprey binary at $bin (build it, or set OSPREY_BIN)" >&2
  exit 1
fi
# A relative $OSPREY_BIN is relative to where this script was run from (pytest runs in tests/e2e).
bin="$(realpath "$bin")"
export OSPREY_BIN="$bin"
cd "$repo/tests/e2e"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" .
