#!/usr/bin/env bash
# shellcheck disable=SC2317  # finish/summary run from the EXIT trap
# Same-run peers on one GPU (issue 8 item 7): osprey, llama.cpp's CUDA build and
# Hugging Face transformers on Llama-3-8B shapes with dummy bf16 weights, in one
# command on one machine (docs/bench.md, "Same-run peers"). From the repo root:
#   OUT=/tmp/peers bash bench/gpu/peers.sh
# Needs: an NVIDIA GPU with sm_90a (the builds target it), nvcc, cmake, ninja,
# python3 with numpy (the GGUF writer) and torch + transformers (the last stage),
# .llamacpp/llama.cpp-src.tar.xz (`bench/llamacpp/cuda_peer.sh prepare`, which
# needs the internet), and osprey's build dependencies; where PCRE2 / utf8proc
# headers are missing, Debian .deb files in .debs/ (apt-get download libpcre2-dev
# libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev
# libutf8proc2) are unpacked into /tmp/px and used.
# Stages (each one's failure is logged and the next stage still runs):
#   llamacpp-build  cuda_peer.sh run BUILD_ONLY=1 PREBUILT=none, in the background
#   gguf            the 16 GB dummy GGUF, written in the background
#   build           osprey (CUDA, sm_90a, target `osprey`) in build-gpu/, beside them
#   llamacpp        once its build is done (waited for until END_S - 200 s):
#                   cuda_peer.sh run (llama-bench pp2048 / tg128, batched-bench b128
#                   512/256; EXTRA runs off); a build still running then is stopped,
#                   and a second run of this script on the same machine finishes it
#   osprey          `osprey bench offline` as bench/gpu/figures.sh: decode_b1,
#                   ttft_2048, peer_512_256
#   hf              bench/hf/hf_generate.py, batch 128, 512 in / 256 out
# On an H100 machine (16 cores, session 11) the two builds side by side took
# longer than the stages after them together (llama.cpp: 263 of 287 steps in
# ~350 s), so a 600-second limit may need the second run.
# Output ($OUT, at most 7 files): peers.log (everything, timestamps), summary.txt,
# peers_logs.tgz (all tool logs and JSONs), llamacpp_cuda.jsonl, llamacpp_cuda.log,
# hf_512_256.json, osprey.jsonl (one line per osprey run).
# Env: END_S (seconds from the start by which the script should be done, default
#      585), WORK (llama.cpp work folder, default /tmp/llamacpp-peer), SKIP_HF=1,
#      SKIP_LLAMACPP=1, LL_JOBS (default 14), OSP_JOBS (default 6).
set -uo pipefail
t0=$(date +%s)
end_s=${END_S:-585}
out=${OUT:-/tmp/peers-out}
tmp=/tmp/peers-logs                  # packed into $out/peers_logs.tgz
work=${WORK:-/tmp/llamacpp-peer}
root=$(pwd)
mkdir -p "$out" "$work"
rm -rf "$tmp"; mkdir -p "$tmp/osprey"
log=$out/peers.log; : > "$log"
stages=()                            # "name seconds status" per stage, for the summary

el() { echo $(( $(date +%s) - t0 )); }
left() { echo $(( end_s - $(el) )); }
say() { echo "[$(date -u +%H:%M:%S) +$(el)s] $*" | tee -a "$log"; }
st_name="" st_t=0
begin() { st_name=$1; st_t=$(date +%s); say "== stage $1 (left ${2:-$(left)}s)"; }
done_() {  # status
  local s=$(( $(date +%s) - st_t ))
  stages+=("$st_name ${s}s ${1:-ok}"); say "== stage $st_name: ${1:-ok} in ${s}s"
}
gpu_line() {
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used \
    --format=csv,noheader 2>&1 | sed "s/^/  gpu $1: /" | tee -a "$log"
}
pack() {
  tar -C /tmp -czf "$out/peers_logs.tgz.part" peers-logs 2>/dev/null && mv -f "$out/peers_logs.tgz.part" "$out/peers_logs.tgz"
  rm -f "$out/peers_logs.tgz.part"
}
tail_to_log() { { echo "  ---- tail of $1"; tail -"${2:-15}" "$1" 2>/dev/null | sed 's/^/  | /'; } | tee -a "$log"; }

# ---------------------------------------------------------------- summary
summary() {
  python3 - "$tmp" "$out" <<'PY' 2>&1
import json, os, sys, glob
tmp, out = sys.argv[1], sys.argv[2]
rows = []
def f(x, n=1):
    return "-" if x is None else f"{x:,.{n}f}"
# osprey
for name in ["decode_b1", "ttft_2048", "peer_512_256"]:
    p = os.path.join(tmp, "osprey", name + ".json")
    try:
        m = json.load(open(p))["throughput"]["concurrent"]["metrics"]
        tpot = m.get("mean_tpot_ms")
        rows.append(f"osprey   {name:<18} out tok/s {f(m.get('output_throughput'))}  TTFT mean {f(m.get('mean_ttft_ms'), 2)} ms"
                    f"  TPOT mean {f(tpot, 3)} ms" + (f" ({1000 / tpot:.1f} tok/s)" if name == "decode_b1" and tpot else ""))
    except Exception as e:
        rows.append(f"osprey   {name:<18} no result ({type(e).__name__})")
# llama.cpp
p = os.path.join(out, "llamacpp_cuda.jsonl")
if os.path.exists(p):
    for line in open(p):
        try:
            d = json.loads(line)
        except Exception:
            continue
        if d.get("summary") == "llama-bench":
            what = f"pp{d['n_prompt']} ub{d['n_ubatch']}" if d["n_prompt"] else f"tg{d['n_gen']} ub{d['n_ubatch']}"
            val = f"TTFT {d['ttft_ms']} ms" if "ttft_ms" in d else f"TPOT {d['tpot_ms']} ms ({d['avg_ts']} tok/s)"
            rows.append(f"llama.cpp llama-bench {what:<12} {val}")
        elif "out_tok_s_incl_prefill" in d:
            rows.append(f"llama.cpp batched pl{d['pl']} {d['pp']}/{d['tg']}: out tok/s incl prefill {f(d['out_tok_s_incl_prefill'])}"
                        f"  (decode-only {f(d.get('speed_tg'))}, prefill {f(d.get('speed_pp'))} tok/s)")
        elif d.get("status") not in (None, "ok"):
            rows.append(f"llama.cpp stage {d.get('stage')}: {d.get('status')}")
else:
    rows.append("llama.cpp no llamacpp_cuda.jsonl")
# transformers
p = os.path.join(out, "hf_512_256.json")
try:
    d = json.loads([l for l in open(p) if l.startswith("{")][-1])
    rows.append(f"transformers {d['transformers']} b{d['batch']} {d['input_len']}/{d['output_len']}: out tok/s {f(d['output_tok_s'])}"
                f" ({d['seconds']} s, {d['gpu']})")
except Exception as e:
    rows.append(f"transformers no result ({type(e).__name__})")
print("\n".join(rows))
PY
}

finished=0
finish() {
  [[ $finished == 1 ]] && return; finished=1
  say "== summary (total $(el)s)"
  {
    echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
    echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
         "(changed files: $(git -C "$root" status --short 2>/dev/null | wc -l))   date: $(date -u +%FT%TZ)"
    echo "stages: ${stages[*]:-none}"
    summary
  } > "$out/summary.txt"
  tee -a "$log" < "$out/summary.txt"
  cp -f "$out/summary.txt" "$tmp/" 2>/dev/null
  pack
}
trap finish EXIT
trap 'say "signal: stopping"; exit 143' TERM INT

# ---------------------------------------------------------------- start
say "peers: OUT=$out END_S=$end_s WORK=$work root=$root"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; echo "cores $(nproc)";
  free -g | sed -n 2p; df -h /tmp | tail -1; nvcc --version | tail -1; } 2>&1 | sed 's/^/  /' | tee -a "$log"

# ---------------------------------------------------------------- debs
begin debs
if pkg-config --exists libpcre2-8 libutf8proc 2>/dev/null; then
  done_ "not needed (installed)"
elif ls .debs/*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/px && for f in .debs/*.deb; do dpkg -x "$f" /tmp/px || say "dpkg -x $f failed"; done
  export PKG_CONFIG_PATH=/tmp/px/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=/tmp/px
  export LD_LIBRARY_PATH=/tmp/px/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  done_ ok
else
  done_ "PCRE2 / utf8proc missing and no .debs/*.deb: osprey's configure will fail"
fi

# ---------------------------------------------------------------- llama.cpp build (background, no prebuilt pack)
lb_pid=""
if [[ "${SKIP_LLAMACPP:-0}" != 1 ]]; then
  begin llamacpp-build-start
  ( OUT=$tmp/llbuild WORK=$work BUILD_ONLY=1 SAVE_BIN=0 PREBUILT=none JOBS=${LL_JOBS:-14} \
      bash bench/llamacpp/cuda_peer.sh run ) > "$tmp/llbuild.out" 2> "$tmp/llbuild.err" &
  lb_pid=$!
  done_ "ok (pid $lb_pid)"
fi

# ---------------------------------------------------------------- gguf (background)
begin gguf-start
gguf=$work/dummy-llama-3-8b-bf16.gguf
gsrc=/tmp/peers-gguf-src
gguf_pid=""
rm -rf "$gsrc"; mkdir -p "$gsrc"; rm -f "$gguf"
if [[ "${SKIP_LLAMACPP:-0}" == 1 ]]; then
  done_ skipped
elif tar -xJf .llamacpp/llama.cpp-src.tar.xz -C "$gsrc" llama.cpp/gguf-py 2>"$tmp/gguf_untar.log" ||
     python3 -c 'import sys, tarfile
t = tarfile.open(sys.argv[1], "r:xz")
m = [x for x in t.getmembers() if x.name.startswith("llama.cpp/gguf-py/")]
t.extractall(sys.argv[2], members=m, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))' \
       .llamacpp/llama.cpp-src.tar.xz "$gsrc" 2>>"$tmp/gguf_untar.log"; then
  ( s=$(date +%s)
    GGUF_PY=$gsrc/llama.cpp/gguf-py python3 bench/llamacpp/make_dummy_gguf.py "$gguf" --preset llama-3-8b --dtype bf16
    rc=$?; echo "make_dummy_gguf rc=$rc in $(( $(date +%s) - s ))s"; exit $rc
  ) > "$tmp/gguf.log" 2>&1 &
  gguf_pid=$!
  done_ "ok (pid $gguf_pid)"
else
  tail_to_log "$tmp/gguf_untar.log"; done_ "failed: gguf-py not unpacked (cuda_peer.sh will write the GGUF itself)"
fi

# ---------------------------------------------------------------- osprey build
bin=$root/build-gpu/tools/osprey
begin build
rm -f "$bin"   # a stale binary from an earlier call must not pass for this tree's
if cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DOSPREY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
     -DOSPREY_TESTS=OFF -DOSPREY_BENCH=OFF > "$tmp/osprey_configure.log" 2>&1; then
  # build deadline: done by END_S - 180 (380 s) so that the benches keep their time
  bt=$(( end_s - 200 - $(el) )); (( bt < 60 )) && bt=60
  if timeout "$bt" ninja -C build-gpu -j${OSP_JOBS:-6} osprey > "$tmp/osprey_build.log" 2>&1 && [[ -x "$bin" ]]; then
    say "  built: $(grep -c 'Building' "$tmp/osprey_build.log") objects"; done_ ok
  else
    grep -E "error|FAILED" -A3 "$tmp/osprey_build.log" | head -40 | tee -a "$log"
    tail_to_log "$tmp/osprey_build.log" 5; done_ "failed (or timed out at ${bt}s)"
  fi
else
  tail_to_log "$tmp/osprey_configure.log" 25; done_ "configure failed"
fi
pack

# The GGUF writer (5-20 s) is long done by now; wait so that nothing runs beside the benches.
gguf_ok=0
if [[ -n "$gguf_pid" ]]; then
  begin gguf-wait
  if wait "$gguf_pid"; then gguf_ok=1; grep '^{' "$tmp/gguf.log" | tee -a "$log"; done_ ok
  else tail_to_log "$tmp/gguf.log"; rm -f "$gguf"; done_ failed; fi
fi

lb_ok=0
if [[ -n "$lb_pid" ]]; then
  begin llamacpp-build-wait
  wt=$(( end_s - 200 - $(el) )); (( wt < 10 )) && wt=10
  for ((i = 0; i < wt; i++)); do kill -0 "$lb_pid" 2>/dev/null || break; sleep 1; done
  if kill -0 "$lb_pid" 2>/dev/null; then
    kill "$lb_pid" 2>/dev/null; pkill -f "ninja -C $work/build" 2>/dev/null
    tail_to_log "$tmp/llbuild.err" 5; done_ "timed out after ${wt}s: llama.cpp not built"
  elif wait "$lb_pid"; then lb_ok=1; grep -E '"stage"' "$tmp/llbuild/llamacpp_cuda.jsonl" 2>/dev/null | tee -a "$log"; done_ ok
  else tail_to_log "$tmp/llbuild.err" 20; done_ failed; fi
fi

# ---------------------------------------------------------------- llama.cpp benches (built above)
if [[ "${SKIP_LLAMACPP:-0}" != 1 && $lb_ok == 1 ]]; then
  lt=$(( $(left) - 130 ))
  (( lt > 90 )) && lt=90
  if (( lt < 40 )); then
    stages+=("llamacpp 0s skipped"); say "llama.cpp skipped: ${lt}s"
  else
    begin llamacpp
    OUT=$tmp/llamacpp WORK=$work REUSE_MODELS=$gguf_ok PREBUILT=none DEADLINE_S=$(( lt - 10 )) JOBS=16 SAVE_BIN=0 EXTRA=0 \
      timeout "$lt" bash bench/llamacpp/cuda_peer.sh run > "$tmp/llamacpp_run.out" 2> "$tmp/llamacpp_run.err"
    rc=$?
    cp -f "$tmp/llamacpp/llamacpp_cuda.jsonl" "$tmp/llamacpp/llamacpp_cuda.log" "$out/" 2>/dev/null
    grep -E '"summary"|out_tok_s_incl_prefill' "$tmp/llamacpp_run.out" | cut -c1-400 | sed 's/^/  /' | tee -a "$log"
    if [[ $rc == 0 ]]; then done_ ok; else tail_to_log "$tmp/llamacpp_run.err" 20; done_ "rc=$rc"; fi
    rm -f "$gguf"
    gpu_line after-llamacpp
  fi
  pack
fi

# ---------------------------------------------------------------- osprey benches
common=(bench offline --mode throughput --device cuda --load-format dummy --model llama-3-8b --random-prompts
        --num-sequential 0 --max-num-batched-tokens 8192)
orun() {  # name, timeout seconds, args...
  local name=$1 t=$2 lim; shift 2
  lim=$(( $(left) - 75 ))   # keep ~75 s for transformers
  (( lim < t )) && t=$lim
  if (( t < 15 )); then stages+=("osprey-$name 0s skipped"); say "  skip osprey $name: ${t}s"; return; fi
  begin "osprey-$name"
  timeout "$t" "$bin" "${common[@]}" "$@" --output-json "$tmp/osprey/$name.json" > "$tmp/osprey/$name.txt" 2>&1
  local rc=$?
  grep -E "^  concurrent|Output token throughput|^TTFT |^TPOT " "$tmp/osprey/$name.txt" | sed 's/^/  /' | tee -a "$log"
  if [[ -s "$tmp/osprey/$name.json" ]]; then
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["run"]=sys.argv[2]; print(json.dumps(d))' \
      "$tmp/osprey/$name.json" "$name" >> "$out/osprey.jsonl" 2>/dev/null
  fi
  if [[ $rc == 0 ]]; then done_ ok; else tail_to_log "$tmp/osprey/$name.txt" 8; done_ "rc=$rc"; fi
  gpu_line "after $name"
}
if [[ -x "$bin" ]]; then
  gpu_line before-osprey
  orun decode_b1        120 --num-prompts 1 --input-len 128 --output-len 512
  orun ttft_2048        120 --num-prompts 1 --input-len 2048 --output-len 2
  orun peer_512_256     240 --num-prompts 128 --max-num-seqs 128 --input-len 512 --output-len 256
else
  stages+=("osprey 0s skipped(no-binary)"); say "no osprey binary: osprey benches skipped"
fi
pack

# ---------------------------------------------------------------- transformers
if [[ -n "${SKIP_HF:-}" ]]; then
  stages+=("hf 0s skipped(SKIP_HF)")
else
  ht=$(( $(left) - 5 ))
  if (( ht < 70 )); then
    stages+=("hf 0s skipped"); say "transformers skipped: ${ht}s left"
  else
    begin hf
    timeout "$ht" python3 bench/hf/hf_generate.py --model llama-3-8b --batch 128 --input-len 512 --output-len 256 \
      > "$out/hf_512_256.json" 2> "$tmp/hf_512_256.log"
    rc=$?
    cp -f "$out/hf_512_256.json" "$tmp/" 2>/dev/null
    sed 's/^/  /' "$out/hf_512_256.json" | tee -a "$log"
    if [[ $rc == 0 ]]; then done_ ok; else tail_to_log "$tmp/hf_512_256.log" 10; done_ "rc=$rc"; fi
    gpu_line after-hf
  fi
fi
exit 0
