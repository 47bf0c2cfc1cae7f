"""The CLI test scripts' shared check list (tests/cli/*_test.py): check()
records one assertion and prints it when it fails; finish() prints the
tally and gives the script's exit status. Standard library only.
"""
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
