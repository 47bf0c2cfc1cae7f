#!/usr/bin/env python3
"""Prints the headline metrics of one kernel launch from an ncu raw CSV.

usage: ncu_metrics.py RAW_CSV
RAW_CSV is what `ncu --import REPORT.ncu-rep --page raw --csv` prints for a
report of one launch taken with `--set full` (docs/bench.md). Prints, one
a line with its value and unit: the duration, registers, L2 and DRAM
traffic, the pipes' shares of issue, the tensor pipe's active cycles,
instructions, issue activity, the warp-state samples by stall reason and
the shared-memory bank conflicts (the lines PERF.md quotes).
"""
import csv
import sys

KEEP = ("gpu__time_duration.sum", "launch__registers_per_thread", "lts__t_sectors.avg.pct", "sm__inst_executed_pipe_",
        "sm__pipe_tensor_cycles_active.avg.pct", "smsp__inst_executed.sum", "smsp__issue_active.avg.pct",
        "smsp__pcsamp_warps_issue_stalled_", "dram__bytes_read.sum", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared")


def main() -> int:
    with open(sys.argv[1], newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    h = next((i for i, r in enumerate(rows) if "gpu__time_duration.sum" in r), None)
    if h is None or h + 2 >= len(rows):
        print("no metric header and launch row in " + sys.argv[1], file=sys.stderr)
        return 1
    head, units, val = rows[h], rows[h + 1], rows[h + 2]
    for i, name in enumerate(head):
        if name.startswith(KEEP) and not name.endswith("_not_issued") and i < len(val):
            unit = units[i] if i < len(units) else ""
            print(f"  {name:75s} {val[i]} {unit}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
