#!/usr/bin/env bash
# Creates <repo>/.venv-bench with llama-cpp-python (pinned in requirements-bench.txt),
# compiled from its sdist (CPU only, native flags). Idempotent: returns quickly when
# the pinned version is already importable.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${OSPREY_BENCH_VENV:-$root/.venv-bench}"
req="$here/requirements-bench.txt"
want="$(sed -n 's/^llama-cpp-python==//p' "$req")"
jobs="${OSPREY_BUILD_JOBS:-2}"

if [[ -x "$venv/bin/python" ]] && \
   have="$("$venv/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null)" && \
   [[ "$have" == "$want" ]]; then
  echo "llama-cpp-python $have already in $venv"
  exit 0
fi

python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
# Build from source: no binary wheel, CPU backend, use the build host's SIMD.
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF}"
export CMAKE_BUILD_PARALLEL_LEVEL="$jobs"
"$venv/bin/python" -m pip install --no-binary llama-cpp-python --no-cache-dir -v -r "$req"
"$venv/bin/python" -c 'import llama_cpp; print("installed llama-cpp-python", llama_cpp.__version__)'
