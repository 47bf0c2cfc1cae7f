#!/usr/bin/env bash
# Builds the CUDA backend and the GPU tests, runs them on this machine's GPU
# and prints a short table (one line per test suite).
#
# Environment (all optional):
#   OSPREY_CUDA_ARCHS   CMAKE_CUDA_ARCHITECTURES (default: the GPU's own, e.g. 90a on Hopper)
#   OSPREY_GPU_BUILD    build folder (default: build-gpu in the repo)
#   OUT                 folder for gpu_tests.log / gpu_tests.xml (default: the build folder)
#   GTEST_FILTER        passed through to the test binary
#   OSPREY_GPU_BENCH=1  also build and run gpu_op_bench (op timings) and model_bench (dummy
#                       Llama-3-8B bf16: TTFT, decode ms/step and MBU, per-op breakdown);
#                       both print figures and assert nothing
#   OSPREY_GPU_TEST_GGUF  SmolLM2 GGUF for the default-model test (else the
#                       cached default model, else .devdata/*.truncated.gguf)
#   OSPREY_GPU_PARITY_1B  folder holding a random model of llama-3.2-1b shapes and its transformers
#                       reference (tests/gpu/make_1b_fixture.py --out), for ModelParity1B.Fp32AndBf16
#                       (skipped when unset). "generate": write it first, with this machine's python3
#                       (torch with CUDA, transformers >= 5), into $OSPREY_GPU_PARITY_1B_DIR (default
#                       ${TMPDIR:-/tmp}/osprey_parity_1b; 2.5 GB), in the background while gpu_tests
#                       builds; log in $OUT/make_1b_fixture.log; a failed generation fails the run
#   OSPREY_GPU_SANITIZE=1  afterwards run gpu_tests under compute-sanitizer: memcheck (with
#                       leak check) on a filter covering every kernel family, racecheck and
#                       synccheck on the attention / sampling / norm / RoPE kernels (shared
#                       memory and barriers), initcheck on row ops, attention and sampling;
#                       prints each tool's summary line, logs in $OUT/sanitize_<tool>.log.
#                       Needs a runtime that lets the tool attach (Firecracker does; gVisor
#                       answers "Device not supported"). Filters: OSPREY_SANITIZE_{MEMCHECK,
#                       RACECHECK,INITCHECK}_FILTER; OSPREY_SANITIZE_TOOLS (default "memcheck
#                       racecheck synccheck initcheck"); per-tool limit in seconds
#                       OSPREY_SANITIZE_TIMEOUT_<TOOL> (e.g. _MEMCHECK), else OSPREY_SANITIZE_TIMEOUT,
#                       else 240 (a tool stopped there prints no summary line)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${OSPREY_GPU_BUILD:-$root/build-gpu}
out=${OUT:-$build}
mkdir -p "$build" "$out"

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "run.sh: no NVIDIA GPU visible (nvidia-smi -L failed)" >&2
  exit 2
fi
gpu_line=$(nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader | head -1)
echo "GPU: $gpu_line"
if [[ -z "${OSPREY_CUDA_ARCHS:-}" ]]; then
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
  OSPREY_CUDA_ARCHS=$cap
  [[ "$cap" == "90" ]] && OSPREY_CUDA_ARCHS=90a
fi

cmake_args=(-S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSPREY_CUDA=ON -DOSPREY_TESTS=ON
            "-DCMAKE_CUDA_ARCHITECTURES=$OSPREY_CUDA_ARCHS")
# Until tests/CMakeLists.txt adds tests/gpu itself, inject it after project().
if ! grep -q 'add_subdirectory(gpu)' "$root/tests/CMakeLists.txt"; then
  cmake_args+=("-DCMAKE_PROJECT_INCLUDE=$root/tests/gpu/standalone.cmake")
fi
# The top-level configure requires PCRE2 and utf8proc (tokenizer module),
# which the GPU tests do not link. Where their pkg-config files are missing,
# empty stand-ins let the configure pass; only the tokenizer could not build.
stub_dir=$build/pkgconfig-stubs
for mod in libpcre2-8 libutf8proc; do
  if ! pkg-config --exists "$mod" 2>/dev/null; then
    mkdir -p "$stub_dir"
    printf 'Name: %s\nDescription: stand-in for the GPU tests (tokenizer not built)\nVersion: 99\nLibs:\nCflags:\n' \
      "$mod" >"$stub_dir/$mod.pc"
    echo "run.sh: $mod not installed; using an empty pkg-config stand-in (the tokenizer cannot be built here)"
  fi
done
[[ -d "$stub_dir" ]] && export PKG_CONFIG_PATH="$stub_dir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"

gen_pid=
gen_failed=0
if [[ "${OSPREY_GPU_PARITY_1B:-}" == generate ]]; then
  gen_dir=${OSPREY_GPU_PARITY_1B_DIR:-${TMPDIR:-/tmp}/osprey_parity_1b}
  echo "run.sh: generating the 1B parity model into $gen_dir (log: $out/make_1b_fixture.log)"
  python3 "$root/tests/gpu/make_1b_fixture.py" --out "$gen_dir" >"$out/make_1b_fixture.log" 2>&1 &
  gen_pid=$!
  # A failed build exits early: stop the generator with it.
  trap '[[ -n "$gen_pid" ]] && kill "$gen_pid" 2>/dev/null' EXIT
fi

t0=$(date +%s)
cmake "${cmake_args[@]}" >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
targets=(gpu_tests)
# Engine-level tests need the real tokenizer libraries (no stand-ins).
[[ -d "$stub_dir" ]] || targets+=(gpu_engine_tests)
[[ "${OSPREY_GPU_BENCH:-0}" == 1 ]] && targets+=(gpu_op_bench model_bench)
ninja -C "$build" -j"$(nproc)" "${targets[@]}" >"$out/build.log" 2>&1 || { grep -E 'error|FAILED' -A3 "$out/build.log" | head -60; exit 1; }
t1=$(date +%s)
echo "built gpu_tests for sm_$OSPREY_CUDA_ARCHS in $((t1 - t0)) s"

if [[ -n "$gen_pid" ]]; then
  gen_status=0
  wait "$gen_pid" || gen_status=$?
  gen_pid=
  if [[ $gen_status -eq 0 ]]; then
    export OSPREY_GPU_PARITY_1B=$gen_dir
    grep -E '^(prompt of|wrote)' "$out/make_1b_fixture.log" || true
  else
    echo "run.sh: tests/gpu/make_1b_fixture.py failed; ModelParity1B will skip" >&2
    tail -20 "$out/make_1b_fixture.log" >&2
    unset OSPREY_GPU_PARITY_1B
    gen_failed=1
  fi
fi

bin=$(find "$build/tests" -name gpu_tests -type f -perm -u+x | head -1)
set +e
"$bin" --gtest_output="xml:$out/gpu_tests.xml" ${GTEST_FILTER:+--gtest_filter="$GTEST_FILTER"} >"$out/gpu_tests.log" 2>&1
rc=$?
set -e
engine_bin=$(find "$build/tests" -name gpu_engine_tests -type f -perm -u+x | head -1)
if [[ -n "$engine_bin" && ! -d "$stub_dir" ]]; then
  set +e
  "$engine_bin" --gtest_output="xml:$out/gpu_engine_tests.xml" ${GTEST_FILTER:+--gtest_filter="$GTEST_FILTER"} \
    >"$out/gpu_engine_tests.log" 2>&1
  erc=$?
  set -e
  [[ $rc -eq 0 ]] && rc=$erc
  grep -E '^\[  FAILED  \]|Failure|check failed' "$out/gpu_engine_tests.log" | head -40 || true
fi
t2=$(date +%s)
[[ $gen_failed -eq 1 && $rc -eq 0 ]] && rc=1
grep -E '^\[  FAILED  \]|Failure|check failed|^default model' "$out/gpu_tests.log" | head -40 || true
grep -E 'llama_3_2_1b_random prompt' "$out/gpu_tests.log" | head -40 || true

python3 - "$out/gpu_tests.xml" "$gpu_line" "$rc" "$out/gpu_engine_tests.xml" <<'PY'
import os, sys, xml.etree.ElementTree as ET
path, gpu, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
suites = []
for p in [path] + [x for x in sys.argv[4:] if os.path.exists(x)]:
    try:
        suites += ET.parse(p).getroot().findall("testsuite")
    except Exception as e:  # crashed before writing the XML
        print(f"no XML results in {p} ({e}); exit code {rc}")
print(f"\n{'suite':<44} {'tests':>5} {'pass':>5} {'fail':>5} {'skip':>5} {'sec':>7}")
tot = [0, 0, 0, 0, 0.0]
for s in suites:
    cases = s.findall("testcase")
    fail = sum(1 for c in cases if c.find("failure") is not None)
    skip = sum(1 for c in cases if c.find("skipped") is not None or c.get("result") == "skipped")
    n = len(cases)
    t = float(s.get("time", 0))
    print(f"{s.get('name'):<44} {n:>5} {n - fail - skip:>5} {fail:>5} {skip:>5} {t:>7.2f}")
    for i, v in enumerate((n, n - fail - skip, fail, skip, t)):
        tot[i] += v
print(f"{'total':<44} {tot[0]:>5} {tot[1]:>5} {tot[2]:>5} {tot[3]:>5} {tot[4]:>7.2f}")
print(f"GPU: {gpu}; gtest exit code {rc}")
PY
echo "tests ran in $((t2 - t1)) s; logs in $out"
if [[ "${OSPREY_GPU_SANITIZE:-0}" == 1 ]]; then
  san=$(command -v compute-sanitizer || true)
  [[ -z "$san" && -x /usr/local/cuda/bin/compute-sanitizer ]] && san=/usr/local/cuda/bin/compute-sanitizer
  if [[ -z "$san" ]]; then
    echo "run.sh: compute-sanitizer not found; no sanitizer run" >&2
    [[ $rc -eq 0 ]] && rc=1
  else
    # Every kernel family: embedding/norms/RoPE/silu/gather/convert (OpsTest, HalfOps), GEMV, cuBLASLt
    # and panels (MatmulTest, *Ops.Matmul*), kv_write, decode/generic/mma prefill attention and split merge
    # (AttentionTest, *Attention*), the sampler (SamplingTest), whole models (three fixtures in fp32/bf16/f16).
    # Left out for time: the 4096-token prefill sweeps, the 1B dummy models, the throughput benches.
    mem_filter=${OSPREY_SANITIZE_MEMCHECK_FILTER:-'OpsTest.*:MatmulTest.*:MatmulExactTest.*:AttentionTest.*:AttentionSplitTest.*:SamplingTest.*:Dtypes/HalfOps.*:Dtypes/HalfAttention.*:HalfCommon.*:Fixtures/ModelParity.LogitsAndGreedyMatchReference/llama_gqa:Fixtures/ModelParityBf16.*/qwen3:Fixtures/ModelParityF16.*/gguf_llama_Q4_1:NormFold.ScaleColumns*:NormFold.RmsScaledQkv*:NormFold.RmsScaledSiluMulUnaligned*:-*LongPrompts*:*Throughput*:*DummyLlama32_1b*'}
    race_filter=${OSPREY_SANITIZE_RACECHECK_FILTER:-'AttentionTest.*:AttentionSplitTest.*:SamplingTest.*:OpsTest.RmsNorm*:OpsTest.RopeMatchesCpu:Dtypes/HalfOps.RowOpsMatchCpu/*:Dtypes/HalfOps.FusedQkvRopeKvWriteMatchesCpu/*:Dtypes/HalfAttention.*:NormFold.RmsScaledQkv*:NormFold.RmsScaledSiluMulUnaligned*'}
    init_filter=${OSPREY_SANITIZE_INITCHECK_FILTER:-'OpsTest.*:AttentionTest.*:SamplingTest.*:Dtypes/HalfOps.RowOpsMatchCpu/f16:Dtypes/HalfAttention.DecodeWithPaddingAndGraphContract/f16'}
    san_limit=${OSPREY_SANITIZE_TIMEOUT:-240}
    run_sanitizer() {  # tool filter extra-args...
      local tool=$1 filter=$2
      shift 2
      local log="$out/sanitize_$tool.log" t0 src limit_var
      limit_var=OSPREY_SANITIZE_TIMEOUT_${tool^^}
      local limit=${!limit_var:-$san_limit}
      t0=$(date +%s)
      set +e
      # Not --gtest_brief: a run stopped at its limit still shows which tests finished.
      timeout -k 10 "$limit" "$san" --tool "$tool" --error-exitcode 99 "$@" "$bin" \
        --gtest_filter="$filter" >"$log" 2>&1
      src=$?
      set -e
      local summary
      summary=$(grep -E '^========= (ERROR|RACECHECK|LEAK) SUMMARY' "$log" | tr '\n' ' ' || true)
      local ran
      ran=$(grep -E '^\[==========\] .* tests? from .* ran' "$log" | tail -1 || true)
      local passed
      passed=$(grep -c '^\[       OK \]' "$log" || true)
      echo "compute-sanitizer $tool: exit $src in $(($(date +%s) - t0)) s; ${summary:-no summary line}; ${ran:-no gtest summary ($passed tests finished)}"
      grep -m3 -E 'Device not supported|not supported on this|Invalid __|Race reported|Uninitialized' "$log" || true
      if [[ $src -ne 0 && $rc -eq 0 ]]; then rc=$src; fi
    }
    echo "compute-sanitizer: $("$san" --version | tail -1)"
    for tool in ${OSPREY_SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
      case $tool in
        memcheck) run_sanitizer memcheck "$mem_filter" --leak-check full ;;
        racecheck) run_sanitizer racecheck "$race_filter" --racecheck-report all ;;
        synccheck) run_sanitizer synccheck "$race_filter" ;;
        initcheck) run_sanitizer initcheck "$init_filter" ;;
        *) echo "run.sh: unknown sanitizer tool $tool" >&2 ;;
      esac
    done
  fi
fi
if [[ "${OSPREY_GPU_BENCH:-0}" == 1 ]]; then
  "$(find "$build/tests" -name gpu_op_bench -type f -perm -u+x | head -1)" | tee "$out/gpu_op_bench.txt" || true
  "$(find "$build/tests" -name model_bench -type f -perm -u+x | head -1)" | tee "$out/model_bench.txt" || true
fi
exit $rc
