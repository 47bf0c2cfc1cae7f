"""The CLI test scripts' shared check list (tests/cli/*_test.py): check()
records one assertion and prints it when it fails; finish() prints the
tally and gives the script's exit status; run_command() runs the tool under
test. Standard library only.
"""
import subprocess
import sys

_failures = []
_checks = 0


def check(cond, what):
    global _checks
    _checks += 1
    if not cond:
        _failures.append(what)
        print("FAIL:", what)


def finish():
    print(f"{_checks - len(_failures)} of {_checks} checks passed, {len(_failures)} failed")
    sys.exit(1 if _failures else 0)


def run_command(cmd, stdin=None, timeout=60, out_errors="replace"):
    """Runs cmd (a list) with stdin (bytes or None); returns (exit status,
    stdout, stderr), decoded as UTF-8 (stdout's undecodable bytes handled by
    out_errors, stderr's replaced)."""
    p = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", out_errors), p.stderr.decode("utf-8", "replace")
