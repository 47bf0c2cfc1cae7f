#!/usr/bin/env python3
"""bench/gpu/leave_one_out.sh against a stand-in model_bench (a script that
prints model_bench's decode lines, its graph-replay step time depending on
OSPREY_BENCH_SKIP): the labels it reads from the breakdown (labels with
spaces and '+', calls, ms, share and rate columns), one run per label with
that label in OSPREY_BENCH_SKIP, the full step first and last, and the
table of step times and differences against the mean of the two full
runs; a skipped run that fails shown as such with its log; a clear exit
when the full step prints no graph replay time. Needs no
GPU; bash and the standard library only.
Usage: leave_one_out_test.py REPO_ROOT
"""
import os
import stat
import subprocess
import sys
import tempfile

from checks import check, finish

TOOL = os.path.join(sys.argv[1], "bench", "gpu", "leave_one_out.sh")

# The stand-in: the step takes 10 ms; leaving out an op takes its cost off.
# Every call appends "<skip>|<args>" to calls.txt.
FAKE = r"""#!/usr/bin/env bash
here=$(dirname "$0")
echo "${OSPREY_BENCH_SKIP}|$*" >> "$here/calls.txt"
[ -n "${FAKE_NO_GRAPH:-}" ] && { echo "batch-1 decode"; exit 0; }
# A run that fails without a time (the table says so and goes on).
[ "${OSPREY_BENCH_SKIP}" = "gather_rows" ] && { echo "CUDA error: out of memory"; exit 1; }
case "${OSPREY_BENCH_SKIP}" in
  "") t=10.000 ;;
  "rms_norm+matmul+silu_mul 28672x4096") t=6.500 ;;
  "matmul+add 4096x14336") t=8.250 ;;
  "paged_attention") t=9.600 ;;
  "embedding") t=10.020 ;;
  *) t=99.0 ;;
esac
cat <<EOF
device: cuda:0 (stand-in)
batch-1 decode (bytes/step = weights without the embedding table + KV read):
   context    ms/step    tok/s    GB/step     MBU
      2048     10.100     99.0      15.28   50.0%   graph replay: $t ms/step, 100.0 tok/s, MBU 50.0%
decode breakdown at context 2048 (event-timed, launch gaps excluded):
  op                            calls         ms   share GB/s (weights or KV read, % of copy)
  rms_norm+matmul+silu_mul 28672x4096     32      3.906   38.0%     3952 (93%)
  matmul+add 4096x14336            32      2.095   21.9%     3431 (81%)
  paged_attention                  32      0.427    8.5%      629 (15%)
  embedding                         1      0.048    1.0% 
  gather_rows                       1      0.005    0.1% 
  total                                    6.476 (sum of op times)
EOF
"""


def main():
    with tempfile.TemporaryDirectory() as d:
        build = os.path.join(d, "build")
        bench_dir = os.path.join(build, "tests", "gpu")
        os.makedirs(bench_dir)
        fake = os.path.join(bench_dir, "model_bench")
        with open(fake, "w") as f:
            f.write(FAKE)
        os.chmod(fake, os.stat(fake).st_mode | stat.S_IXUSR)
        out = os.path.join(d, "out")
        p = subprocess.run(["bash", TOOL, build, out, "--decode-only", "--ctx", "2048"], capture_output=True,
                           timeout=120)
        stdout = p.stdout.decode()
        check(p.returncode == 0, f"exit 0 (got {p.returncode}: {p.stderr.decode()})")

        with open(os.path.join(bench_dir, "calls.txt")) as f:
            calls = [ln.rstrip("\n").split("|") for ln in f]
        skips = [c[0] for c in calls]
        check(skips == ["", "rms_norm+matmul+silu_mul 28672x4096", "matmul+add 4096x14336", "paged_attention",
                        "embedding", "gather_rows", ""], f"full step, each label once in breakdown order, full step (got {skips})")
        check(all(c[1] == "llama-3-8b bfloat16 --decode-only --ctx 2048" for c in calls),
              f"model_bench gets the config and the arguments (got {[c[1] for c in calls]})")

        rows = {}
        for ln in stdout.splitlines():
            parts = ln.rsplit(None, 3)
            if len(parts) == 4 and parts[3].endswith("%"):
                rows[parts[0]] = parts[1:]
        check(rows.get("rms_norm+matmul+silu_mul 28672x4096") == ["6.500", "3.500", "35.0%"],
              f"the fused gate/up row (got {rows})")
        check(rows.get("matmul+add 4096x14336") == ["8.250", "1.750", "17.5%"], "the down row")
        check(rows.get("paged_attention") == ["9.600", "0.400", "4.0%"], "the attention row")
        check(rows.get("embedding") == ["10.020", "-0.020", "-0.2%"], "a negative difference is printed as such")
        check(any(ln.startswith("gather_rows") and "no time" in ln and "loo_skip_5.log" in ln
                  for ln in stdout.splitlines()), f"a run without a time: 'no time' and its log (got {stdout})")
        check("full step: 10.000 (first run), 10.000 (last run)" in stdout, "the two full runs")
        check(os.path.exists(os.path.join(out, "loo_table.txt")), "the table is written to OUT/loo_table.txt")

        # No graph replay time: a message and a failing exit, no table.
        os.remove(os.path.join(bench_dir, "calls.txt"))
        out2 = os.path.join(d, "out2")
        p = subprocess.run(["bash", TOOL, build, out2, "--decode-only"], capture_output=True, timeout=60,
                           env=dict(os.environ, FAKE_NO_GRAPH="1"))
        check(p.returncode != 0 and "no graph replay time" in p.stderr.decode(),
              f"no graph replay time: non-zero exit and a message (got {p.returncode}: {p.stderr.decode()})")
        check(not os.path.exists(os.path.join(out2, "loo_table.txt")), "no table without a full step time")

        # No model_bench in the build folder.
        p = subprocess.run(["bash", TOOL, os.path.join(d, "nowhere"), out2], capture_output=True, timeout=60)
        check(p.returncode != 0 and "model_bench" in p.stderr.decode(), "a build folder without model_bench")


main()
finish()
