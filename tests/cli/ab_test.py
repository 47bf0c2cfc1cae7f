#!/usr/bin/env python3
"""bench/gpu/ab.sh on a stand-in tree: a git repository whose "build" bakes
the value in src/val.txt into a tool script, and two patches that change
the value. Checks that A runs the tree as it is and B and C the trees with
each patch, each entry's environment and arguments (a gtest-like pattern
passed literally, not globbed), rounds alternating the variants, AB_TEST
running every variant's gpu_tests (A's too), the patches taken back out
and the objects their rebuilds made deleted,
the outputs packed into OUT/ab.tgz, and a patch that does not apply
refused before any build. Needs no GPU; bash, git and the standard
library only.
Usage: ab_test.py REPO_ROOT
"""
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

from checks import check, finish

TOOL = os.path.join(sys.argv[1], "bench", "gpu", "ab.sh")

# The stand-in build: bdir/tool prints the value the tree held at build time,
# FOO from the environment and its arguments; every build appends a line to
# builds.txt (with the binaries' names it was asked for).
BUILD = r"""#!/usr/bin/env bash
mkdir -p bdir/sub
v=$(cat src/val.txt)
cat > bdir/sub/tool <<EOF
#!/usr/bin/env bash
echo "val=$v foo=\${FOO:-} args=\$*"
EOF
chmod +x bdir/sub/tool
cat > bdir/sub/gpu_tests <<EOF
#!/usr/bin/env bash
echo "[  PASSED  ] val=$v \$*"
EOF
chmod +x bdir/sub/gpu_tests
sleep 0.05  # past the coarse file clock: the object is newer than ab.sh's mark
echo "$v" > bdir/sub/val.o
echo "build $*" >> builds.txt
"""


def git(repo, *args):
    subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True)


def main():
    with tempfile.TemporaryDirectory() as d:
        repo = os.path.join(d, "repo")
        os.makedirs(os.path.join(repo, "src"))
        with open(os.path.join(repo, "src", "val.txt"), "w") as f:
            f.write("1\n")
        with open(os.path.join(repo, "build.sh"), "w") as f:
            f.write(BUILD)
        with open(os.path.join(repo, ".gitignore"), "w") as f:
            f.write("bdir/\nbuilds.txt\nchange.diff\nother.diff\nbad.diff\n")
        git(repo, "init", "-q")
        git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
        git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
        with open(os.path.join(repo, "src", "val.txt"), "w") as f:
            f.write("2\n")
        diff = subprocess.run(["git", "-C", repo, "diff"], check=True, capture_output=True).stdout
        git(repo, "checkout", "src/val.txt")
        with open(os.path.join(repo, "change.diff"), "wb") as f:
            f.write(diff)
        with open(os.path.join(repo, "other.diff"), "wb") as f:
            f.write(diff.replace(b"+2", b"+3"))
        # A file a glob in the arguments would match.
        open(os.path.join(repo, "--f=axb"), "w").close()

        out = os.path.join(d, "out")
        bins = os.path.join(d, "bins")
        env = dict(os.environ, OUT=out, AB_PATCH="change.diff other.diff", AB_BUILD_CMD="bash build.sh && touch bdir/sub/base.o",
                   AB_REBUILD_CMD="bash build.sh", AB_BUILD_DIR="bdir", AB_BIN_DIR=bins,
                   AB_RUNS="one|FOO=x|tool a b;two||tool --f=*x*", AB_ROUNDS="2")
        p = subprocess.run(["bash", TOOL], cwd=repo, env=env, capture_output=True, timeout=60)
        check(p.returncode == 0, f"exit 0 (got {p.returncode}: {p.stdout.decode()} {p.stderr.decode()})")
        with open(os.path.join(repo, "src", "val.txt")) as f:
            check(f.read() == "1\n", "the patch is taken back out")
        check(not os.path.exists(os.path.join(repo, "bdir", "sub", "val.o")),
              "the objects a patch's rebuild made are deleted (the next build compiles the tree again)")
        check(os.path.exists(os.path.join(repo, "bdir", "sub", "base.o")), "A's objects are kept")
        with open(os.path.join(repo, "builds.txt")) as f:
            builds = f.read().split("\n")
        check(builds[:3] == ["build ", "build tool", "build tool"],
              f"A built, then B and C rebuilt with the runs' binaries (got {builds})")

        tgz = os.path.join(out, "ab.tgz")
        check(os.path.exists(tgz) and not os.path.exists(os.path.join(out, "ab")),
              "the outputs are packed into OUT/ab.tgz and the folder removed")
        files = {}
        if os.path.exists(tgz):
            with tarfile.open(tgz) as t:
                for m in t.getmembers():
                    if m.isfile():
                        files[os.path.basename(m.name)] = t.extractfile(m).read().decode().strip()
        for r in (1, 2):
            check(files.get(f"one_A_r{r}.txt") == "val=1 foo=x args=a b", f"A round {r}: the tree as it is ({files})")
            check(files.get(f"one_B_r{r}.txt") == "val=2 foo=x args=a b", f"B round {r}: the patched tree")
            check(files.get(f"two_A_r{r}.txt") == "val=1 foo= args=--f=*x*",
                  f"a pattern in the arguments is passed as it is (got {files.get(f'two_A_r{r}.txt')})")
            check(files.get(f"two_B_r{r}.txt") == "val=2 foo= args=--f=*x*", "B of the second entry")
            check(files.get(f"one_C_r{r}.txt") == "val=3 foo=x args=a b",
                  f"C round {r}: the tree with the second patch")
        with open(os.path.join(out, "ab.log")) as f:
            lines = [ln.split("] ", 1)[1] for ln in f.read().splitlines()]
        runs = [ln for ln in lines if re.fullmatch(r"\w+ [A-H] r\d+ rc=\d+", ln)]
        check(lines[:3] == ["build A rc=0", "build B (change.diff) rc=0", "build C (other.diff) rc=0"],
              f"the log's build lines (got {lines[:3]})")
        check(runs == [f"{t} {v} r{r} rc=0" for r in (1, 2) for t in ("one", "two") for v in "ABC"],
              f"rounds alternate the variants, entry by entry (got {runs})")

        # AB_TEST: every variant's gpu_tests, A's included, with the filter.
        shutil.rmtree(out)
        p = subprocess.run(["bash", TOOL], cwd=repo, env=dict(env, AB_TEST="Suite.*", AB_ROUNDS="1"),
                           capture_output=True, timeout=60)
        check(p.returncode == 0, f"AB_TEST: exit 0 (got {p.returncode}: {p.stdout.decode()})")
        tests = {}
        if os.path.exists(tgz):
            with tarfile.open(tgz) as t:
                for m in t.getmembers():
                    if m.isfile() and os.path.basename(m.name).startswith("test_"):
                        tests[os.path.basename(m.name)] = t.extractfile(m).read().decode().strip()
        check(tests == {f"test_{v}.txt": f"[  PASSED  ] val={n} --gtest_filter=Suite.*" for v, n in
                        (("A", 1), ("B", 2), ("C", 3))},
              f"AB_TEST runs each variant's gpu_tests with the filter, A's too (got {tests})")
        with open(os.path.join(out, "ab.log")) as f:
            log = f.read()
        check(all(f"gpu_tests {v} (Suite.*) rc=0" in log for v in "ABC"), f"the log names each test run ({log})")

        # A patch that does not apply: refused before any build.
        with open(os.path.join(repo, "bad.diff"), "w") as f:
            f.write(diff.decode().replace("-1", "-7"))
        os.remove(os.path.join(repo, "builds.txt"))
        shutil.rmtree(out)
        p = subprocess.run(["bash", TOOL], cwd=repo, env=dict(env, AB_PATCH="change.diff bad.diff"),
                           capture_output=True, timeout=60)
        check(p.returncode == 2 and "does not apply" in p.stdout.decode(),
              f"a patch that does not apply: exit 2 and a message (got {p.returncode}: {p.stdout.decode()})")
        check(not os.path.exists(os.path.join(repo, "builds.txt")), "nothing built for a patch that does not apply")


main()
finish()
