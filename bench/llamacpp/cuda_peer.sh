#!/usr/bin/env bash
# Same-run peer for issue 8 item 7: llama.cpp's CUDA build, from the llama.cpp that
# llama-cpp-python 0.3.36 (requirements-bench.txt) vendors in its PyPI sdist, on a
# dummy GGUF with osprey's llama-3-8b shapes (random BF16, optionally F16, weights).
#
#   bench/llamacpp/cuda_peer.sh prepare   # here, with internet: writes .llamacpp/ (git-ignored)
#   bench/llamacpp/cuda_peer.sh prebuild  # here, optional (nvcc, no GPU needed): CUDA binaries
#                                         # into .llamacpp/, so that `run` skips its build
#   bench/llamacpp/cuda_peer.sh run       # on the GPU machine (no internet): build, GGUF, benches
#
# prepare: downloads the sdist (pip download --no-binary :all:), checks its sha256,
#   and packs what the build needs (vendor/llama.cpp without models/, docs/, tests/,
#   the web UI: a ~5.5 MB .tar.xz instead of the 77 MB sdist, which would not fit the
#   device's 64 MiB carry) into .llamacpp/llama.cpp-src.tar.xz, plus
#   .llamacpp/SOURCE.txt (versions, hashes). gguf-py comes from the same tree: no wheel.
# run: on the device machine, carrying `.llamacpp`:
#     OUT=$OUT bench/llamacpp/cuda_peer.sh run
#   Prints JSON lines (kept in $OUT/llamacpp_cuda.jsonl): one per stage
#   {"stage","seconds","status"} and one per bench result. $OUT/llamacpp_cuda.log has
#   timestamps, nvidia-smi before/after and each stage; the tools' own logs are packed
#   into $OUT/llamacpp_logs.tgz at the end. At most 8 files land in $OUT.
#   Stages: unpack; prebuilt binaries (if carried, and if they load and see the GPU)
#   or configure + build (GGML_CUDA=ON, sm_90a, Release, only
#   llama-bench and llama-batched-bench), while the GGUF is written in the background;
#   llama-bench -p 2048 -n 128 -ngl 99 -fa 1 (TTFT of 2048 tokens, batch-1 decode);
#   llama-batched-bench at batch 128 with 512/256, then batch 64 and 256 at 128/128.
#
# Env (run):
#   CUDA=1|0      0: CPU build (-ngl 0), for checking the pipeline without a GPU
#   SMALL=0|1     1: tiny model (2 layers, hidden 256, vocab 128256) and tiny benches
#   DTYPES        GGUF weight types to bench, default "bf16" ("bf16 f16": both)
#   JOBS          build parallelism, default $(nproc)
#   WORK          build + model folder, default /tmp/llamacpp-peer (16 GB per dtype)
#   BUILD_DIR     build folder (default $WORK/build); an existing one is reused
#   SRC           an unpacked llama.cpp tree to use instead of the tarball
#   SAVE_BIN      1 (default with CUDA=1): pack the built bin/ into
#                 $OUT/llamacpp_bin.tar.xz.part-aa, -ab, ... (15 MiB each, so they come back)
#   PREBUILT      such a .tar.xz, or the common prefix of its parts: skips the build
#                 (default with CUDA=1: .llamacpp/llamacpp_bin_sm90a.tar.xz if there; "none": build)
#   BUILD_ONLY=1  stop after the build (and SAVE_BIN)
#   BATCHED=0     skip llama-batched-bench; EXTRA=0 skips its batch 64/256 runs
#   UB            llama-bench ubatch sizes, default "512,2048" (512 is llama.cpp's default)
#   FA_QUANTS     GGML_CUDA_FA_QUANTS, default "f16-f16;bf16-bf16" (see docs/bench.md)
#   DEADLINE_S    seconds from the start after which the call will be killed (e.g. the run's
#                 timeout_s minus 30): batched runs that would not finish in time are skipped
#                 (status "skipped") so that the finished results and logs still come back
#   KEEP_MODELS=1 keep the GGUF files (default: removed at the end)
#   REUSE_MODELS=1 use a GGUF already at $WORK/dummy-<preset>-<dtype>.gguf instead of
#                 writing it (one that a caller wrote completely beforehand, e.g. with
#                 make_dummy_gguf.py while something else builds, or KEEP_MODELS=1)
#   PYTHON        python with numpy (default python3)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
store="$root/.llamacpp"
version="$(sed -n 's/^llama-cpp-python==//p' "$here/requirements-bench.txt")"
# sha256 of llama_cpp_python-0.3.36.tar.gz as PyPI served it on 2026-11-26.
sdist_sha256="${LLAMACPP_SDIST_SHA256:-832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e}"
src_tar="$store/llama.cpp-src.tar.xz"

prepare() {
  local dl="${LLAMACPP_DL:-/tmp/llamacpp-dl}"
  mkdir -p "$dl" "$store"
  local sdist="$dl/llama_cpp_python-$version.tar.gz"
  if [[ ! -f "$sdist" ]]; then
    python3 -m pip download --no-binary :all: --no-deps "llama-cpp-python==$version" -d "$dl"
  fi
  local sum; sum="$(sha256sum "$sdist" | cut -d' ' -f1)"
  if [[ "$sum" != "$sdist_sha256" ]]; then
    echo "sha256 mismatch for $sdist: $sum (expected $sdist_sha256)" >&2; exit 1
  fi
  local tmp; tmp="$(mktemp -d)"
  tar -xzf "$sdist" -C "$tmp"
  local v="$tmp/llama_cpp_python-$version/vendor"
  local commit=unknown
  if command -v git >/dev/null && [[ -e "$v/llama.cpp/.git" ]]; then
    commit="$(git -C "$v/llama.cpp" rev-parse HEAD 2>/dev/null || echo unknown)"
  fi
  # Everything CMake configures with tools on (their sources must exist), minus
  # data the two benches never read. --sort/--mtime/--owner: same bytes each time.
  tar -C "$v" --sort=name --mtime='2026-01-01 00:00Z' --owner=0 --group=0 --numeric-owner \
      --exclude='llama.cpp/tools/ui' -cJf "$src_tar.tmp" \
      llama.cpp/CMakeLists.txt llama.cpp/LICENSE llama.cpp/licenses llama.cpp/cmake llama.cpp/ggml \
      llama.cpp/src llama.cpp/include llama.cpp/common llama.cpp/tools llama.cpp/vendor llama.cpp/gguf-py
  mv "$src_tar.tmp" "$src_tar"
  {
    echo "llama-cpp-python $version sdist sha256 $sum"
    echo "vendored llama.cpp commit $commit"
    echo "llama.cpp-src.tar.xz sha256 $(sha256sum "$src_tar" | cut -d' ' -f1)"
  } > "$store/SOURCE.txt"
  rm -rf "$tmp"
  cat "$store/SOURCE.txt"
  du -sh "$store"
}

# ---------------------------------------------------------------------------- run
cuda="${CUDA:-1}" small="${SMALL:-0}" dtypes="${DTYPES:-bf16}"
jobs="${JOBS:-$(nproc)}" work="${WORK:-/tmp/llamacpp-peer}" py="${PYTHON:-python3}"
out="${OUT:-$root/out/llamacpp}"
logs="$work/logs" log="" jsonl=""

now() { date -u +%Y-%m-%dT%H:%M:%SZ; }
say() { echo "[$(now)] $*" | tee -a "$log" >&2; }
emit() { echo "$1" | tee -a "$jsonl"; }  # one JSON line to stdout and the .jsonl
stage_t0=0
stage_begin() { stage_t0=$(date +%s.%N); say "stage $1 ..."; }
stage_end() {  # name [status]
  local s; s=$(awk -v a="$stage_t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  say "stage $1 done in ${s}s (${2:-ok})"
  emit "{\"stage\": \"$1\", \"seconds\": $s, \"status\": \"${2:-ok}\"}"
}
t_start=$(date +%s)
time_left() {  # seconds before DEADLINE_S (a large number when unset)
  if [[ -n "${DEADLINE_S:-}" ]]; then echo $(( DEADLINE_S - ($(date +%s) - t_start) )); else echo 999999; fi
}
fail_tail() {  # file: its last lines into the main log
  { echo "---- tail of $(basename "$1")"; tail -25 "$1"; } | tee -a "$log" >&2
}
untar() {  # archive|- dir: .tar.xz or .tar.gz; python's tarfile where xz is not installed
  if command -v xz >/dev/null; then tar -xJf "$1" -C "$2"; return; fi
  "$py" -c 'import sys, tarfile
src = sys.argv[1]
t = tarfile.open(fileobj=sys.stdin.buffer, mode="r|*") if src == "-" else tarfile.open(src, "r:*")
t.extractall(sys.argv[2], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))' "$1" "$2"
}
pack_logs() { [[ -d "$logs" ]] && tar -C "$work" -czf "$out/llamacpp_logs.tgz" logs 2>/dev/null || true; }

# llama-batched-bench prints its results through llama.cpp's asynchronous logger,
# which can drop the last lines when the process exits (upstream issue 22142, "logs
# may be lost if not flushed before the program exits"; seen here: the result row
# missing in 2 of 3 runs). One line flushes it before exit; nothing else in the tool
# or the library changes.
patch_src() {  # llama.cpp tree
  local bb="$1/tools/batched-bench/batched-bench.cpp"
  if ! grep -q 'common_log_pause(common_log_main())' "$bb"; then
    sed -i 's|^    llama_backend_free();$|    llama_backend_free();\n    common_log_pause(common_log_main()); // osprey peer script: flush queued log lines|' "$bb"
    grep -q 'common_log_pause(common_log_main())' "$bb" || { echo "could not patch $bb" >&2; exit 1; }
    echo "patched $bb: flush the logger before exit" >&2
  fi
}

# Here, on a machine with nvcc 13.0 and no GPU: the CUDA binaries for sm_90a into
# .llamacpp/llamacpp_bin_sm90a.tar.xz, so that `run` on the GPU machine skips the
# build. Differences from run's own build, none on the GPU path: CPU code for
# AVX2 (not -march=native, which would be this host's), no NCCL (multi-GPU
# only; its library sits elsewhere there), sm_90a machine code only (90a-real:
# no compute_90a PTX, which the driver would JIT only for a GPU without sm_90a
# code; it was 19 of the 41 MB packed, too much for the 64 MiB carry next to the
# tree), and symbol tables stripped (the dynamic symbols stay). ~40 min on 2
# shared cores.
prebuild() {
  local w="${WORK:-/tmp/llamacpp-prebuild}" t0; t0=$(date +%s)
  rm -rf "$w/src"; mkdir -p "$w/src"
  tar -xJf "$src_tar" -C "$w/src"
  patch_src "$w/src/llama.cpp"
  local cm=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
            -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DGGML_CCACHE=OFF
            -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real "-DGGML_CUDA_FA_QUANTS=${FA_QUANTS:-f16-f16;bf16-bf16}"
            -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON
            -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
            "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined")  # no libcuda.so.1 (driver) here
  cmake -S "$w/src/llama.cpp" -B "${BUILD_DIR:-$w/build}" "${cm[@]}" > "$w/configure.log"
  nice -n 19 ninja -C "${BUILD_DIR:-$w/build}" -j "${JOBS:-2}" llama-bench llama-batched-bench
  rm -rf "$w/pack"; mkdir -p "$w/pack"; cp -a "${BUILD_DIR:-$w/build}/bin" "$w/pack/"
  find "$w/pack/bin" -type f -exec strip --strip-unneeded {} +
  tar -C "$w/pack" --sort=name --owner=0 --group=0 --numeric-owner -cf - bin | xz -T0 -9 > "$store/llamacpp_bin_sm90a.tar.xz"
  {
    echo "prebuilt $(date -u +%FT%TZ) on $(uname -n) ($(. /etc/os-release && echo "$PRETTY_NAME"), $(nvcc --version | tail -1), g++ $(g++ -dumpfullversion)) in $(( $(date +%s) - t0 ))s"
    echo "from llama.cpp-src.tar.xz sha256 $(sha256sum "$src_tar" | cut -d' ' -f1), batched-bench logger flush patched in"
    echo "cmake ${cm[*]}"
    echo "binaries stripped (strip --strip-unneeded); llamacpp_bin_sm90a.tar.xz $(stat -c %s "$store/llamacpp_bin_sm90a.tar.xz") bytes, sha256 $(sha256sum "$store/llamacpp_bin_sm90a.tar.xz" | cut -d' ' -f1)"
  } > "$store/llamacpp_bin_sm90a.txt"
  cat "$store/llamacpp_bin_sm90a.txt"; ls -la "$store"
}

run() {
  mkdir -p "$out" "$work"
  rm -rf "$logs"; mkdir -p "$logs"
  log="$out/llamacpp_cuda.log" jsonl="$out/llamacpp_cuda.jsonl"
  : > "$log"; : > "$jsonl"
  trap pack_logs EXIT
  [[ -f "$src_tar" || -n "${SRC:-}" ]] || { say "missing $src_tar: run '$0 prepare' here and carry .llamacpp"; exit 1; }
  local t_all; t_all=$(date +%s)
  say "llamacpp peer: CUDA=$cuda SMALL=$small DTYPES='$dtypes' JOBS=$jobs WORK=$work"
  [[ -f "$store/SOURCE.txt" ]] && sed 's/^/  /' "$store/SOURCE.txt" | tee -a "$log" >&2
  { uname -a; echo "cores: $(nproc)"; free -g | head -2; df -h "$work" | tail -1; } 2>&1 | tee -a "$log" >&2
  if [[ "$cuda" == 1 ]]; then
    { nvidia-smi; nvcc --version | tail -2; cmake --version | head -1; } 2>&1 | tee -a "$log" >&2 || true
    local gpu; gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1 || true)"
    emit "{\"gpu\": \"$gpu\", \"date\": \"$(now)\"}"
  fi

  # 1. sources (the GGUF writer's gguf-py comes from the same tree)
  local src="${SRC:-$work/src/llama.cpp}"
  if [[ -z "${SRC:-}" ]]; then
    stage_begin unpack
    rm -rf "$work/src"; mkdir -p "$work/src"
    untar "$src_tar" "$work/src"   # keeps the archive's mtimes: an old build dir stays valid
    stage_end unpack
  fi

  patch_src "$src"

  # 2. GGUF files, written in the background while the build runs
  local preset=llama-3-8b; [[ "$small" == 1 ]] && preset=tiny
  local models=() gguf_pid=""
  for d in $dtypes; do models+=("$work/dummy-$preset-$d.gguf"); done
  if [[ "${BUILD_ONLY:-0}" != 1 ]]; then
    (
      for d in $dtypes; do
        f="$work/dummy-$preset-$d.gguf"
        if [[ "${REUSE_MODELS:-0}" == 1 && -s "$f" ]]; then
          echo "{\"gguf\": \"$f\", \"preset\": \"$preset\", \"dtype\": \"$d\", \"bytes\": $(stat -c %s "$f"), \"reused\": true}"
          continue
        fi
        GGUF_PY="$src/gguf-py" "$py" "$here/make_dummy_gguf.py" "$f" --preset "$preset" --dtype "$d" || exit 1
      done
    ) > "$logs/gguf.log" 2>&1 &
    gguf_pid=$!
  fi

  # 3. build, or use binaries built before: PREBUILT, else (CUDA=1) the
  #    .llamacpp/llamacpp_bin_sm90a.tar.xz that `prebuild` made, if carried.
  #    Binaries that miss a library or see no GPU are dropped for a fresh build.
  local build="${BUILD_DIR:-$work/build}" prebuilt="${PREBUILT:-}"
  if [[ -z "$prebuilt" && "$cuda" == 1 && -f "$store/llamacpp_bin_sm90a.tar.xz" ]]; then
    prebuilt="$store/llamacpp_bin_sm90a.tar.xz"
    [[ -f "$store/llamacpp_bin_sm90a.txt" ]] && sed 's/^/  /' "$store/llamacpp_bin_sm90a.txt" | tee -a "$log" >&2
  fi
  [[ "$prebuilt" == none ]] && prebuilt=""
  if [[ -n "$prebuilt" ]]; then
    stage_begin unpack-prebuilt
    rm -rf "${build:?}/bin"; mkdir -p "$build"
    if [[ -f "$prebuilt" ]]; then untar "$prebuilt" "$build"
    else cat "$prebuilt".part-* | untar - "$build"; fi
    local missing devs
    missing="$(LD_LIBRARY_PATH="$build/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$build"/bin/* 2>/dev/null \
               | grep 'not found' | sort -u || true)"
    devs="$(LD_LIBRARY_PATH="$build/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$build/bin/llama-bench" --list-devices 2>&1 || true)"
    echo "$devs" | tee -a "$log" >&2
    if [[ -n "$missing" ]] || { [[ "$cuda" == 1 ]] && ! grep -q CUDA <<< "$devs"; }; then
      say "prebuilt binaries unusable here (${missing:-no CUDA device listed}): building from source"
      rm -rf "$build"; prebuilt=""
      stage_end unpack-prebuilt unusable
    else
      stage_end unpack-prebuilt
    fi
  fi
  if [[ -z "$prebuilt" ]]; then
    stage_begin configure
    local cm=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
              -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DGGML_CCACHE=OFF)
    if [[ "$cuda" == 1 ]]; then
      cm+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a "-DGGML_CUDA_FA_QUANTS=${FA_QUANTS:-f16-f16;bf16-bf16}")
    else
      cm+=(-DGGML_CUDA=OFF)
    fi
    say "cmake ${cm[*]}"
    if ! cmake -S "$src" -B "$build" "${cm[@]}" > "$logs/configure.log" 2>&1; then
      fail_tail "$logs/configure.log"; stage_end configure failed; exit 1
    fi
    grep -E "CUDA|NCCL|CPU backend|ggml version" "$logs/configure.log" | tee -a "$log" >&2 || true
    stage_end configure
    stage_begin build
    if ! ninja -C "$build" -j "$jobs" llama-bench llama-batched-bench > "$logs/build.log" 2>&1; then
      grep -E "error|FAILED" -A3 "$logs/build.log" | head -40 | tee -a "$log" >&2
      stage_end build failed; exit 1
    fi
    say "objects compiled: $(grep -c 'Building' "$logs/build.log" || true) (CUDA: $(grep -c 'Building CUDA' "$logs/build.log" || true))"
    stage_end build
    if [[ "${SAVE_BIN:-$cuda}" == 1 ]]; then
      stage_begin save-bin
      rm -f "$out"/llamacpp_bin.tar.xz.part-*
      local zip=(xz -T0 -3); command -v xz >/dev/null || zip=(gzip -1)   # untar reads either
      tar -C "$build" -cf - bin | "${zip[@]}" | split -b 15M -a 2 - "$out/llamacpp_bin.tar.xz.part-"
      local nb; nb=$(du -cb "$out"/llamacpp_bin.tar.xz.part-* | tail -1 | cut -f1)
      say "binaries packed: $nb bytes in $(ls "$out"/llamacpp_bin.tar.xz.part-* | wc -l) part(s)"
      if (( nb > 48 * 1024 * 1024 )); then   # the device returns 8 files, 64 MiB in all: logs first
        say "too large to come back with the logs: parts removed"; rm -f "$out"/llamacpp_bin.tar.xz.part-*
      fi
      stage_end save-bin
    fi
  fi
  local bin="$build/bin"
  export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [[ "${BUILD_ONLY:-0}" == 1 ]]; then say "BUILD_ONLY: done in $(( $(date +%s) - t_all ))s"; return 0; fi

  stage_begin gguf-wait   # time the benches waited for the writer; its own seconds are in its JSON line
  if ! wait "$gguf_pid"; then fail_tail "$logs/gguf.log"; stage_end gguf-wait failed; exit 1; fi
  stage_end gguf-wait
  { grep '^{' "$logs/gguf.log" || true; } | while read -r l; do emit "$l"; done
  ls -la "${models[@]}" | tee -a "$log" >&2

  # 4. benches; llama.cpp's defaults otherwise (-b 2048, f16 KV cache, one KV
  #    stream per sequence in batched-bench).
  local ngl=99; [[ "$cuda" == 1 ]] || ngl=0
  local p=2048 n=128 reps=5
  [[ "$small" == 1 ]] && { p=64; n=16; reps=2; }
  local mflags=(); for m in "${models[@]}"; do mflags+=(-m "$m"); done
  stage_begin llama-bench
  # -ub: llama.cpp's default 512 and, for TTFT, one ubatch for the whole prompt
  if ! "$bin/llama-bench" "${mflags[@]}" -p "$p" -n "$n" -ngl "$ngl" -fa 1 -ub "${UB:-512,2048}" \
      -r "$reps" -o jsonl > "$logs/llama-bench.jsonl" 2> "$logs/llama-bench.err"; then
    fail_tail "$logs/llama-bench.err"; stage_end llama-bench failed; exit 1
  fi
  while read -r l; do emit "$l"; done < "$logs/llama-bench.jsonl"
  stage_end llama-bench
  # one summary line per test: TTFT / decode tok/s as the PERF.md rows read them
  "$py" - "$logs/llama-bench.jsonl" <<'PY' | while read -r l; do emit "$l"; done
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    s = {"summary": "llama-bench", "model": d.get("model_filename", "").rsplit("/", 1)[-1],
         "n_prompt": d["n_prompt"], "n_gen": d["n_gen"], "n_ubatch": d["n_ubatch"],
         "avg_ts": round(d["avg_ts"], 2), "stddev_ts": round(d["stddev_ts"], 2)}
    if d["n_prompt"] > 0:
        s["ttft_ms"] = round(1e3 * d["n_prompt"] / d["avg_ts"], 2)
    else:
        s["tpot_ms"] = round(1e3 / d["avg_ts"], 3)
    print(json.dumps(s))
PY

  if [[ "${BATCHED:-1}" != 0 ]]; then
    # name pp tg batch-list seconds-needed (on an H100/H200, with model load and margin)
    local runs=("b128 512 256 128 75")
    [[ "${EXTRA:-1}" != 0 ]] && runs+=("b64_256 128 128 64,256 60")
    [[ "$small" == 1 ]] && runs=("b4 32 16 4 20" "b2_8 16 8 2,8 20")
    for m in "${models[@]}"; do
      for r in "${runs[@]}"; do
        local name pp tg npl need maxpl ctx tag
        read -r name pp tg npl need <<< "$r"
        maxpl=$(tr ',' '\n' <<< "$npl" | sort -n | tail -1)
        ctx=$(( maxpl * (pp + tg) ))   # each of the maxpl streams gets pp + tg cells
        tag="batched-$name-$(basename "$m" .gguf)"
        if (( $(time_left) < need )); then
          say "skipping $tag: $(time_left)s left before DEADLINE_S, it needs ~${need}s"
          emit "{\"stage\": \"$tag\", \"seconds\": 0, \"status\": \"skipped\"}"
          continue
        fi
        stage_begin "$tag"
        if ! "$bin/llama-batched-bench" -m "$m" -ngl "$ngl" -fa on -c "$ctx" -npp "$pp" -ntg "$tg" \
            -npl "$npl" --output-format jsonl > "$logs/$tag.out" 2> "$logs/$tag.err"; then
          fail_tail "$logs/$tag.err"; stage_end "$tag" failed; continue
        fi
        # add the output-token rate over the whole run (prefill included), as osprey counts it
        { grep '^{' "$logs/$tag.out" || true; } | while read -r l; do
          emit "$("$py" -c 'import json,sys; d=json.loads(sys.argv[1]); d["model"]=sys.argv[2]; d["out_tok_s_incl_prefill"]=round(d["pl"]*d["tg"]/d["t"],1); print(json.dumps(d))' "$l" "$(basename "$m")")"
        done
        stage_end "$tag"
      done
    done
  fi
  if [[ "$cuda" == 1 ]]; then
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used --format=csv 2>&1 \
      | tee -a "$log" >&2 || true
  fi
  say "all done in $(( $(date +%s) - t_all ))s"
  if [[ "${KEEP_MODELS:-0}" != 1 ]]; then rm -f "${models[@]}"; fi
}

case "${1:-}" in
  prepare) prepare ;;
  prebuild) prebuild ;;
  run) run ;;
  *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2 ;;
esac
