"""Runs one pytest suite of the bindings for CTest.

usage: run_suite.py --requires numpy,pytest[,...] [--requires-env NAME] -- <pytest arguments>

Exit 77 (CTest: skipped) with the reason when a required module or environment variable is missing,
unless FVATTN_REQUIRE_PYTHON_TESTS=1 (CI), where a missing prerequisite is a failure: a suite that
did not run must not pass as one that did.
"""
import importlib.util
import os
import subprocess
import sys


def main(argv):
    sep = argv.index("--")
    opts, pytest_args = argv[:sep], argv[sep + 1:]
    modules, envs = [], []
    for flag, value in zip(opts[::2], opts[1::2]):
        (modules if flag == "--requires" else envs).extend(v for v in value.split(",") if v)
    missing = [f"Python module {m}" for m in modules if importlib.util.find_spec(m) is None]
    missing += [f"{e} (set by CMake when what it names was built)" for e in envs if not os.environ.get(e)]
    if missing:
        why = f"{sys.executable} lacks: " + ", ".join(missing)
        if os.environ.get("FVATTN_REQUIRE_PYTHON_TESTS") == "1":
            print(f"FAILED: FVATTN_REQUIRE_PYTHON_TESTS=1 but {why}")
            return 1
        print(f"SKIPPED: {why}")
        return 77
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"] + pytest_args
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
