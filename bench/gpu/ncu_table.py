#!/usr/bin/env python3
"""Sums an ncu --csv --page raw log (bench/gpu/ncu_step.sh) by kernel name.

usage: ncu_table.py NCU_CSV [MODEL_BENCH_LOG]
The copy ceiling (GB/s, read + write) is taken from model_bench's
"copy d2d" line when the log is given.
"""
import csv
import re
import sys


def main() -> int:
    with open(sys.argv[1], newline="") as f:
        reader = csv.reader(ln for ln in f if ln.startswith('"'))  # ncu's own lines are not quoted
        header = next(reader)
        units = dict(zip(header, next(reader)))
        rows = list(reader)
    col = {name: i for i, name in enumerate(header)}
    copy = None
    if len(sys.argv) > 2:
        m = re.search(r"copy d2d 2 GiB: (\d+) GB/s", open(sys.argv[2]).read())
        copy = float(m.group(1)) if m else None
    scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}
    tscale = scale.get(units.get("gpu__time_duration.sum", "nsecond"), 1e-3)
    bscale = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}
    rscale = bscale.get(units.get("dram__bytes_read.sum", "byte"), 1e-6)
    wscale = bscale.get(units.get("dram__bytes_write.sum", "byte"), 1e-6)
    agg = {}
    order = []
    for r in rows:
        name = r[col["Kernel Name"]]
        t = float(r[col["gpu__time_duration.sum"]].replace(",", "")) * tscale
        rd = float(r[col["dram__bytes_read.sum"]].replace(",", "")) * rscale
        wr = float(r[col["dram__bytes_write.sum"]].replace(",", "")) * wscale
        key = (name, r[col["Grid Size"]], r[col["Block Size"]])
        if key not in agg:
            agg[key] = [0, 0.0, 0.0, 0.0]
            order.append(key)
        a = agg[key]
        a[0] += 1
        a[1] += t
        a[2] += rd
        a[3] += wr
    total = sum(a[1] for a in agg.values())
    print(f"{'kernel':44s} {'grid':>14s} {'blk':>9s} {'calls':>5s} {'us/call':>8s} {'us':>8s} {'share':>6s} "
          f"{'MB rd':>8s} {'MB wr':>8s} {'GB/s':>6s} {'%copy':>6s}")
    for key in sorted(order, key=lambda k: -agg[k][1]):
        n, t, rd, wr = agg[key]
        gbs = (rd + wr) / t * 1e3 if t > 0 else 0.0  # MB / us = TB/s
        pc = f"{100 * gbs / copy:5.1f}%" if copy else ""
        print(f"{key[0][:44]:44s} {key[1]:>14s} {key[2]:>9s} {n:5d} {t / n:8.2f} {t:8.1f} {100 * t / total:5.1f}% "
              f"{rd:8.2f} {wr:8.2f} {gbs:6.0f} {pc:>6s}")
    print(f"total {total:.1f} us over {sum(a[0] for a in agg.values())} kernels"
          + (f"; copy ceiling {copy:.0f} GB/s" if copy else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
