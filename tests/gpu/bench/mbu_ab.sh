#!/usr/bin/env bash
# Batch-1 decode A/B on a CUDA machine, in one go: builds the working tree
# (gpu_tests, gpu_engine_tests, model_bench), then, if asked, model_bench of
# a baseline (BASE_FILES from BASE_SRC or git revision BASE_REV with
# NEW_FILES removed, or whatever BASE_SCRIPT does; the device copy of the
# tree is changed for that); runs the GPU tests (with and without
# programmatic dependent launch); then model_bench --decode-only for the
# baseline and for each setting of the decode switches (default: PDL off and
# on), and prints the decode lines of each last. Example (issue 8 item 1):
#   OUT=/tmp/mbu BASE_REV=<commit before a change> tests/gpu/bench/mbu_ab.sh
#
# Environment (all optional): OUT (logs, default /tmp/mbu), BASE_REV, BASE_SRC,
# BASE_SCRIPT (a shell command that turns the tree into the baseline instead),
# BASE_FILES / NEW_FILES (space separated paths), MBU_SETTINGS (';'-separated
# env assignments, one model_bench run each), MBU_REPEAT (runs per setting).
# Needs .debs (PCRE2/utf8proc) for gpu_engine_tests; skips them without.
set -uo pipefail
out=${OUT:-/tmp/mbu}
mkdir -p "$out"
rev=${BASE_REV:-}
base_files=${BASE_FILES:-"src/backend/cuda/gemm/gemv.cu src/backend/cuda/norm/rms_norm.cu src/backend/cuda/elementwise/elementwise.cu"}
new_files=${NEW_FILES:-"src/backend/cuda/pdl.cu src/backend/cuda/pdl.cuh"}
settings=${MBU_SETTINGS:-"OSPREY_CUDA_NO_PDL=1;OSPREY_CUDA_NO_PDL=0"}
repeat=${MBU_REPEAT:-2}

if ls .debs/*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/px && for f in .debs/*.deb; do dpkg -x "$f" /tmp/px; done
  export PKG_CONFIG_PATH=/tmp/px/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=/tmp/px
  export LD_LIBRARY_PATH=/tmp/px/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  engine=gpu_engine_tests
else
  engine=
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"

cfg=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DOSPREY_TESTS=ON -DOSPREY_BENCH=OFF)
t0=$(date +%s)
cmake -S . -B build-dev-mbu "${cfg[@]}" >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
ninja -C build-dev-mbu -j16 gpu_tests model_bench $engine >"$out/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A3 "$out/build.log" | head -60; exit 1; }
echo "build: $(($(date +%s) - t0)) s"

# Binaries of this tree, then the baseline in the same build folder: BASE_FILES
# from BASE_SRC (a folder mirroring the repo, e.g. a carried one) or git
# revision BASE_REV, NEW_FILES removed; only those objects rebuild.
bin=/tmp/mbu-bin
mkdir -p "$bin/new" "$bin/base"
cp build-dev-mbu/tests/gpu/gpu_tests build-dev-mbu/tests/gpu/model_bench "$bin/new/"
[[ -n "$engine" ]] && cp build-dev-mbu/tests/gpu/gpu_engine_tests "$bin/new/"
want_base=0
[[ -n "$rev" || -n "${BASE_SRC:-}" || -n "${BASE_SCRIPT:-}" ]] && want_base=1
(
  [[ $want_base == 1 ]] || exit 0
  if [[ -n "${BASE_SCRIPT:-}" ]]; then
    bash -c "$BASE_SCRIPT" >"$out/base_script.log" 2>&1 || { echo "BASE_SCRIPT failed"; cat "$out/base_script.log"; exit 1; }
  else
    for f in $base_files; do
      if [[ -n "${BASE_SRC:-}" && -f "$BASE_SRC/$f" ]]; then cp "$BASE_SRC/$f" "$f"; else git show "$rev:$f" >"$f"; fi
    done
    for f in $new_files; do rm -f "$f"; done
  fi
  ninja -C build-dev-mbu -j16 model_bench >"$out/build_base.log" 2>&1 && cp build-dev-mbu/tests/gpu/model_bench "$bin/base/"
) &
base_pid=$!

"$bin/new/gpu_tests" --gtest_brief=1 >"$out/gpu_tests.log" 2>&1
echo "gpu_tests (PDL on): rc $? $(grep -E '^\[  (PASSED|FAILED)' "$out/gpu_tests.log" | tr '\n' ' ')"
grep -E "^\[  FAILED|Failure" -A3 "$out/gpu_tests.log" | head -30
OSPREY_CUDA_NO_PDL=1 "$bin/new/gpu_tests" --gtest_brief=1 --gtest_filter='Matmul*:Bf16*' \
  >"$out/gpu_tests_nopdl.log" 2>&1
echo "gpu_tests Matmul*:Bf16* (PDL off): rc $? $(grep -E '^\[  (PASSED|FAILED)' "$out/gpu_tests_nopdl.log" | tr '\n' ' ')"
if [[ -n "$engine" ]]; then
  "$bin/new/gpu_engine_tests" --gtest_brief=1 >"$out/gpu_engine_tests.log" 2>&1
  echo "gpu_engine_tests: rc $? $(grep -E '^\[  (PASSED|FAILED)' "$out/gpu_engine_tests.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure" -A3 "$out/gpu_engine_tests.log" | head -20
fi

wait "$base_pid" || { echo "baseline build failed"; grep -E "error|FAILED" -A3 "$out/build_base.log" | head -30; }
bench() {  # label, binary, env assignments...
  local label=$1 bin=$2
  shift 2
  for r in $(seq 1 "$repeat"); do
    env "$@" "$bin" llama-3-8b bfloat16 --decode-only >"$out/bench_${label}_$r.txt" 2>&1
  done
}
[[ -x "$bin/base/model_bench" ]] && bench base "$bin/base/model_bench" OSPREY_UNUSED=1
i=0
IFS=';' read -ra sets <<<"$settings"
for s in "${sets[@]}"; do
  i=$((i + 1))
  # shellcheck disable=SC2086
  bench "new$i" "$bin/new/model_bench" $s
done
# One more baseline after the new runs (drift check).
[[ -x "$bin/base/model_bench" ]] && repeat=1 bench base_again "$bin/base/model_bench" OSPREY_UNUSED=1

for f in "$out"/bench_*.txt; do
  echo "== $(basename "$f" .txt): $(grep -E '^env:' "$f")"
  grep -E "^ +(512|2048|4096|8192) " "$f"
done
echo "== decode breakdown, last new setting:"
sed -n '/decode breakdown/,/total/p' "$out/bench_new${i}_1.txt"
echo "== decode breakdown, baseline:"
sed -n '/decode breakdown/,/total/p' "$out/bench_base_1.txt" 2>/dev/null
