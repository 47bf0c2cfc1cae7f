#!/usr/bin/env python3
"""bench/gpu/ncu_sass.py on a hand-made Nsight Compute source page (the
columns it reads, in ncu's CSV form): the opcode shares, the hottest
instruction with its stall reasons, the runs of instructions executed alike,
and a clear exit on a file that is not such a page. Standard library only.
Usage: ncu_sass_test.py REPO_ROOT
"""
import os
import sys
import tempfile

from checks import check, finish, run_command

TOOL = os.path.join(sys.argv[1], "bench", "gpu", "ncu_sass.py")


HEADER = ['"Address"', '"Source"', '"Warp Stall Sampling (All Samples)"',
          '"Warp Stall Sampling (Not-issued Samples)"', '"Instructions Executed"', '"stall_long_sb"',
          '"stall_wait"', '"stall_long_sb (Not Issued)"']
# address, SASS, samples, not-issued samples, executed, long_sb, wait, long_sb not issued
ROWS = [
    ("0x00", "      LDC R1, c[0x0][0x28]", 1, 1, 10, 0, 1, 0),
    ("0x10", "      LDG.E R4, desc[UR8][R4.64]", 2, 2, 100, 0, 2, 0),
    ("0x20", "@!P0  BRA 0x10", 30, 29, 100, 28, 2, 27),
    ("0x30", "      FADD R1, R2, R3", 7, 6, 100, 0, 7, 0),
    ("0x40", "      EXIT", 0, 0, 10, 0, 0, 0),
]


def page():
    lines = ['"Kernel Name","void k(int)",', ",".join(HEADER)]
    for r in ROWS:
        lines.append(",".join(f'"{v}"' for v in r))
    return "\n".join(lines) + "\n"


def run(path, *args):
    return run_command([sys.executable, TOOL, path, *args])


with tempfile.TemporaryDirectory() as d:
    csv_path = os.path.join(d, "src.csv")
    with open(csv_path, "w") as f:
        f.write(page())
    rc, out, err = run(csv_path, "--top", "2")
    check(rc == 0, f"exit 0 (got {rc}: {err})")
    lines = out.splitlines()
    check("5 instructions, 320 warp instructions executed, 40 samples" in out, "totals line")

    def opcode_line(op):
        return next((ln.split() for ln in lines if ln.split()[:1] == [op]), None)

    # 100 of 320 executed = 31.25%; BRA holds 30 of 40 samples.
    bra = opcode_line("BRA")
    check(bra is not None and bra[1] == "31.2%" and bra[2] == "75.0%", f"BRA shares (got {bra})")
    fadd = opcode_line("FADD")
    check(fadd is not None and fadd[1] == "31.2%" and fadd[2] == "17.5%", f"FADD shares (got {fadd})")
    ldc = opcode_line("LDC")
    check(ldc is not None and ldc[1] == "3.1%" and ldc[2] == "2.5%", f"LDC shares (got {ldc})")
    # The predicate is not part of the opcode.
    check(opcode_line("@!P0") is None, "predicates stripped from opcodes")

    top = lines[lines.index(next(ln for ln in lines if ln.startswith("top 2"))) + 1:][:2]
    check(len(top) == 2 and top[0].split()[:3] == ["2", "100", "30"], f"hottest instruction first (got {top})")
    check(len(top) == 2 and "long_sb 28, wait 2" in top[0], f"its stall reasons (got {top})")
    check(len(top) == 2 and top[1].split()[:3] == ["3", "100", "7"], f"second hottest (got {top})")

    runs_at = next(i for i, ln in enumerate(lines) if ln.startswith("runs executed alike"))
    runs = [ln.split() for ln in lines[runs_at + 1:] if ln.strip()]
    # Instructions 1-3 run 100 times each: 300 of 320 executed, 39 of 40 samples.
    check(["1", "3", "3", "93.8%", "97.5%", "100", "passes"] in runs, f"loop body run (got {runs})")
    check(["0", "0", "1", "3.1%", "2.5%", "10", "passes"] in runs, f"prologue run (got {runs})")

    rc, out, _ = run(csv_path, "--list")
    check(rc == 0 and "     2        100      30  @!P0  BRA 0x10" in out, "--list prints every instruction")

    bad = os.path.join(d, "bad.csv")
    with open(bad, "w") as f:
        f.write("not,an,ncu,page\n")
    rc, out, err = run(bad)
    check(rc == 2 and "not an ncu source page" in err, f"a file without the source page's header: rc 2, a message "
          f"(got {rc}: {err})")

finish()
