#!/usr/bin/env python3
"""bench/gpu/ncu_metrics.py on a hand-made Nsight Compute raw page (ncu's
CSV form, with the lines ncu prints before it): the kept metrics with their
values and units, the others and the "_not_issued" stall counts left out,
and a clear exit on a file without a launch row. Standard library only.
Usage: ncu_metrics_test.py REPO_ROOT
"""
import os
import sys
import tempfile

from checks import check, finish, run_command

TOOL = os.path.join(sys.argv[1], "bench", "gpu", "ncu_metrics.py")

NAMES = ["ID", "Kernel Name", "gpu__time_duration.sum", "device__attribute_max_threads",
         "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum", "smsp__pcsamp_warps_issue_stalled_wait",
         "smsp__pcsamp_warps_issue_stalled_wait_not_issued", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"]
UNITS = ["", "", "us", "", "", "warp", "warp", "%"]
VALUES = ["0", "void k(int)", "310.66", "1024", "601,612", "9084", "8000", "46.7"]


def csv_line(cells):
    return ",".join(f'"{c}"' for c in cells)


def main():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "raw.csv")
        with open(path, "w") as f:
            f.write("==PROF== Connected to process 1\n")
            f.write("\n".join(csv_line(r) for r in (NAMES, UNITS, VALUES)) + "\n")
        code, out, err = run_command([sys.executable, TOOL, path])
        check(code == 0, f"exit 0 (got {code}: {err})")
        lines = [ln.split() for ln in out.splitlines()]
        got = {ln[0]: ln[1:] for ln in lines}
        check(got.get("gpu__time_duration.sum") == ["310.66", "us"], f"the duration with its unit ({out})")
        check(got.get("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum") == ["601,612"],
              f"the store conflicts, no unit ({out})")
        check(got.get("smsp__pcsamp_warps_issue_stalled_wait") == ["9084", "warp"], "a stall reason's samples")
        check(got.get("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active") == ["46.7", "%"],
              "the tensor pipe's share")
        check("device__attribute_max_threads" not in got, "metrics outside the list are left out")
        check("smsp__pcsamp_warps_issue_stalled_wait_not_issued" not in got, "the _not_issued counts are left out")
        check(len(lines) == 4, f"four lines (got {len(lines)})")

        bad = os.path.join(d, "bad.csv")
        with open(bad, "w") as f:
            f.write(csv_line(NAMES) + "\n")
        code, out, err = run_command([sys.executable, TOOL, bad])
        check(code == 1 and "no metric header" in err, f"a page without a launch row: exit 1 and a message ({code}: {err})")


main()
finish()
