"""`pip install ./bindings/python` works, and the installed package finds the libraries bundled in
it (FVATTN_BUNDLE_DIR) with no FVATTN_LIBRARY set and nothing on the loader's path."""
import os
import shutil
import subprocess
import sys

import pytest

PACKAGE_DIR = os.path.join(os.path.dirname(__file__), "..")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("pkg")
    bundle, target = root / "bundle", root / "site"
    bundle.mkdir()
    shutil.copy(os.environ["FVATTN_LIBRARY"], bundle / "libfvattn.so.1")
    if os.environ.get("FVATTN_JAX_LIBRARY"):
        shutil.copy(os.environ["FVATTN_JAX_LIBRARY"], bundle / "libfvattn_jax.so")
    # From a copy, so that the build's by-products (build/, *.egg-info) stay out of the source tree;
    # --no-build-isolation: build with the setuptools already here (tests run without a network).
    source = root / "source"
    shutil.copytree(PACKAGE_DIR, source, ignore=shutil.ignore_patterns("tests", "__pycache__", "build"))
    env = dict(os.environ, FVATTN_BUNDLE_DIR=str(bundle))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "--target", str(target), str(source)], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return target


def run_installed(target, code):
    env = {k: v for k, v in os.environ.items()
           if k not in ("FVATTN_LIBRARY", "FVATTN_JAX_LIBRARY", "LD_LIBRARY_PATH", "PYTHONPATH")}
    env["PYTHONPATH"] = str(target)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=str(target))


def test_installed_package_uses_its_bundled_library(installed):
    code = ("import numpy as np, ml_dtypes, fvattn\n"
            "q = np.ones((1, 1, 64, 64), ml_dtypes.bfloat16)\n"
            "o, _, _ = fvattn.qat_attention_forward(q, q, q, fvattn.QatConfig(quantize=False))\n"
            "print(fvattn.__file__); print(fvattn.library_path()); print(float(o.astype(np.float32).mean()))\n")
    r = run_installed(installed, code)
    assert r.returncode == 0, r.stderr
    module, library, mean = r.stdout.split("\n")[:3]
    assert module.startswith(str(installed))
    assert library == os.path.join(str(installed), "fvattn", "_lib", "libfvattn.so.1")
    assert float(mean) == 1.0  # plain attention over identical rows of ones returns ones


def test_installed_package_registers_bundled_jax_handlers(installed):
    if not os.environ.get("FVATTN_JAX_LIBRARY"):
        pytest.skip("libfvattn_jax.so was not built (JAX not importable at configure time)")
    code = ("import jax.numpy as jnp, fvattn, fvattn.jax as fj\n"
            "from fvattn import _library\n"
            "q = jnp.ones((1, 1, 64, 64), jnp.bfloat16)\n"
            "print(float(fj.qat_attention(q, q, q, fvattn.QatConfig(quantize=False)).astype(jnp.float32).mean())); print(_library.jax_handlers()[1])\n")
    r = run_installed(installed, code)
    assert r.returncode == 0, r.stderr
    mean, path = r.stdout.split("\n")[:2]
    assert float(mean) == 1.0
    assert path == os.path.join(str(installed), "fvattn", "_lib", "libfvattn_jax.so")
