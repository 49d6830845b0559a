"""The README's Python, cffi, torch and JAX examples run as written (paths to the build replaced by
this build's), so the documentation cannot drift from the package."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def blocks():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def run(code):
    code = code.replace('"build/src/libfvattn.so.1"', repr(os.environ["FVATTN_LIBRARY"]))
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)


def test_readme_has_the_examples():
    found = blocks()
    assert len(found) == 5, "README: expected the Python, torch, cffi, JAX and JAX Ulysses examples"
    for marker in ("fvattn.qat_attention_forward", "fvattn.torch", "cffi.FFI", "fj.parallel.ulysses"):
        assert sum(marker in b for b in found) == 1, marker
    assert sum("fvattn.jax" in b for b in found) == 2


@pytest.mark.parametrize("index", range(5))
def test_readme_example_runs(index):
    code = blocks()[index]
    if "fvattn.torch" in code:
        pytest.importorskip("torch", reason="the torch example needs PyTorch")
    if "fvattn.jax" in code and not os.environ.get("FVATTN_JAX_LIBRARY"):
        pytest.fail("FVATTN_JAX_LIBRARY is not set: the JAX example cannot run")
    r = run(code)
    assert r.returncode == 0, r.stderr
