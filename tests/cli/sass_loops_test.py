#!/usr/bin/env python3
"""bench/gpu/sass_loops.py on hand-made `cuobjdump -sass` text: two
functions, loops branching back by address, by label and past operands, a loop nested in
another (only the inner one by default, both with --all), the self-branch
after EXIT left out, predicates and opcode suffixes stripped, --kernel
filtering, and clear exits on a file without functions and on a name that
matches none. Standard library only.
Usage: sass_loops_test.py REPO_ROOT
"""
import os
import sys
import tempfile

from checks import check, finish, run_command

TOOL = os.path.join(sys.argv[1], "bench", "gpu", "sass_loops.py")


def instr(addr, text):
    return f"        /*{addr:04x}*/                   {text} ;      /* 0x000fe40000000800 */\n" \
           f"                                                            /* 0x000fca0000000f00 */\n"


SASS = (
    "\n\tcode for sm_90a\n\t\tFunction : _Z5outerPf\n\t.headerflags\t@\"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)\"\n"
    + instr(0x00, "LDC R1, c[0x0][0x28]")
    + instr(0x10, "S2R R0, SR_TID.X")
    # outer loop 0x20..0x90 holds the inner loop 0x30..0x60
    + instr(0x20, "IMAD.MOV.U32 R2, RZ, RZ, R0")
    + instr(0x30, "HMMA.16816.F32 R4, R8, R12, R4")
    + instr(0x40, "HMMA.16816.F32 R4, R8, R14, R4")
    + instr(0x50, "PRMT R3, R2, 0x4140, R3")
    + instr(0x60, "@!P0 BRA 0x30")
    + instr(0x70, "FADD.FTZ R1, R1, R4")
    + instr(0x80, "ISETP.NE.AND P1, PT, R1, RZ, PT")
    + instr(0x90, "@P1 BRA 0x20")
    + instr(0xa0, "EXIT")
    + instr(0xb0, "BRA 0xb0")
    + "\t\t..........\n\n\n\t\tFunction : _Z5labelPi\n"
    + instr(0x00, "MOV R1, c[0x0][0x28]")
    + ".L_x_3:\n"
    + instr(0x10, "LDG.E R4, desc[UR8][R4.64]")
    + instr(0x20, "IADD3 R5, R5, 0x1, RZ")
    + instr(0x30, "BRA.DIV UR4, `(.L_x_9)")
    + instr(0x40, "@!P2 BRA `(.L_x_3)")
    + instr(0x50, "EXIT")
    + instr(0x58, "BRA.U !UP0, 0x50")
    + ".L_x_9:\n"
    + instr(0x60, "EXIT")
)


def run(path, *args):
    return run_command([sys.executable, TOOL, path, *args])


with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "k.sass")
    with open(path, "w") as f:
        f.write(SASS)
    rc, out, err = run(path)
    check(rc == 0, f"exit 0 (got {rc}: {err})")
    lines = out.splitlines()
    check("_Z5outerPf: 12 instructions" in lines, f"first function's count (got {lines})")
    check("_Z5labelPi: 8 instructions" in lines, f"second function's count (got {lines})")
    inner = "  loop /*0030*/../*0060*/: 4 instructions a pass: HMMA 2, BRA 1, PRMT 1"
    check(inner in lines, f"the inner loop, predicate and suffixes stripped (got {lines})")
    check(not any("/*0020*/../*0090*/" in ln for ln in lines), f"the outer loop only with --all (got {lines})")
    check(not any("/*00b0*/" in ln for ln in lines), f"no self-branch after EXIT (got {lines})")
    check("  loop /*0010*/../*0040*/: 4 instructions a pass: BRA 2, IADD3 1, LDG 1" in lines,
          f"a loop closed by a label (got {lines})")
    check("  loop /*0050*/../*0058*/: 2 instructions a pass: BRA 1, EXIT 1" in lines,
          f"a branch with operands before its target (got {lines})")

    rc, out, _ = run(path, "--all", "--kernel", "outer", "--top", "2")
    lines = out.splitlines()
    check(rc == 0 and not any("label" in ln for ln in lines), f"--kernel keeps one function (got {lines})")
    check("  loop /*0020*/../*0090*/: 8 instructions a pass: BRA 2, HMMA 2" in lines,
          f"--all adds the outer loop, --top 2 (got {lines})")
    check(lines.index(inner.split(":")[0] + ": 4 instructions a pass: HMMA 2, BRA 1")
          < lines.index("  loop /*0020*/../*0090*/: 8 instructions a pass: BRA 2, HMMA 2"), "innermost first")

    rc, _, err = run(path, "--kernel", "nothing_like_this")
    check(rc == 1 and "no function matches" in err, f"no match: exit 1 and why (got {rc}: {err})")

    bad = os.path.join(d, "bad.txt")
    with open(bad, "w") as f:
        f.write("just text\n")
    rc, _, err = run(bad)
    check(rc == 1 and "no 'Function :' sections" in err, f"not SASS: exit 1 and why (got {rc}: {err})")
    rc, _, err = run(os.path.join(d, "missing.sass"))
    check(rc == 1 and "sass_loops:" in err, f"missing file: exit 1 and why (got {rc}: {err})")

finish()
