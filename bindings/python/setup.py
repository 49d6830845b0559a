"""Bundles the built libraries into the package when FVATTN_BUNDLE_DIR names a folder holding
libfvattn.so.1 (and, if built, libfvattn_jax.so):

    FVATTN_BUNDLE_DIR=build/bundle pip install ./bindings/python

Without it the package is pure Python and finds the library through FVATTN_LIBRARY or the
loader's path. The package itself has no compiled code.
"""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithLibraries(build_py):
    def run(self):
        super().run()
        src = os.environ.get("FVATTN_BUNDLE_DIR")
        if not src:
            return
        dest = os.path.join(self.build_lib, "fvattn", "_lib")
        os.makedirs(dest, exist_ok=True)
        found = False
        for name in ("libfvattn.so.1", "libfvattn_jax.so"):
            path = os.path.join(src, name)
            if os.path.exists(path):
                # copy2 follows the libfvattn.so.1 -> libfvattn.so.0.1.0 link: the file itself ships.
                shutil.copy2(path, os.path.join(dest, name))
                found = found or name == "libfvattn.so.1"
        if not found:
            raise SystemExit(f"FVATTN_BUNDLE_DIR={src} holds no libfvattn.so.1")


setup(cmdclass={"build_py": BuildPyWithLibraries})
