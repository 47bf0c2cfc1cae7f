#!/usr/bin/env bash
# Creates <repo>/.venv-ref with the pinned reference stack (transformers, torch CPU,
# gguf, ...) listed in tests/fixtures/requirements-ref.txt. Idempotent: when every
# pinned package is already installed at its pinned version it returns in ~1 s.
#
# Usage: scripts/setup_ref_venv.sh [--force]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${OSPREY_REF_VENV:-$root/.venv-ref}"
req="$root/tests/fixtures/requirements-ref.txt"
python="${PYTHON:-python3}"
force=0
[[ "${1:-}" == "--force" ]] && force=1

# Prints nothing and exits 0 when all pins in $req are satisfied exactly.
pins_satisfied() {
  "$venv/bin/python" - "$req" <<'PY'
import sys
from importlib import metadata
ok = True
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name, want = line.split("==")
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if have != want:
        print(f"{name}: want {want}, have {have}")
        ok = False
sys.exit(0 if ok else 1)
PY
}

if [[ $force -eq 0 && -x "$venv/bin/python" ]] && pins_satisfied; then
  echo "reference venv ok: $venv"
  exit 0
fi

[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
# Everything from PyPI (torch there is the CUDA build; it runs fine on CPU). To get the
# smaller CPU-only torch set OSPREY_TORCH_INDEX=https://download.pytorch.org/whl/cpu.
extra=()
[[ -n "${OSPREY_TORCH_INDEX:-}" ]] && extra=(--extra-index-url "$OSPREY_TORCH_INDEX")
"$venv/bin/python" -m pip install "${extra[@]}" -r "$req"
pins_satisfied
echo "reference venv ready: $venv"
