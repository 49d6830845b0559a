"""Bundles the built libraries into the package when FVATTN_BUNDLE_DIR names a folder holding
libfvattn.so.1 (and, if built, libfvattn_jax.so):

    FVATTN_BUNDLE_DIR=build/bundle pip install ./bindings/python

A relative FVATTN_BUNDLE_DIR is taken from the directory pip was run in (the shell's $PWD: pip runs
this file from the package's own folder), then from the repository root. Without the variable the
package is pure Python and finds the library through FVATTN_LIBRARY or the loader's path; a library
left in the build folder by an earlier bundled install is removed, never shipped. The package itself
has no compiled code.
"""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py


PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(PACKAGE_DIR))


def bundle_dir(value):
    """The folder FVATTN_BUNDLE_DIR names, as an absolute path: a relative one is looked up from the
    shell's working directory, then from the repository root; the first that holds libfvattn.so.1."""
    if os.path.isabs(value):
        candidates = [value]
    else:
        bases = [os.environ.get("PWD"), REPO_ROOT]
        candidates = list(dict.fromkeys(os.path.normpath(os.path.join(b, value)) for b in bases if b))
    for c in candidates:
        if os.path.isfile(os.path.join(c, "libfvattn.so.1")):
            return c
    tried = ", ".join(candidates)
    raise SystemExit(f"FVATTN_BUNDLE_DIR={value}: no libfvattn.so.1 in {tried}. Build the library "
                     "(cmake --build build), copy build/src/libfvattn.so.1 into that folder, or pass "
                     "an absolute path.")


class BuildPyWithLibraries(build_py):
    def run(self):
        # A library bundled by an earlier install may sit in the build folder: never ship it unless
        # this install asks for one.
        dest = os.path.join(self.build_lib, "fvattn", "_lib")
        shutil.rmtree(dest, ignore_errors=True)
        super().run()
        value = os.environ.get("FVATTN_BUNDLE_DIR")
        if not value:
            return
        src = bundle_dir(value)
        os.makedirs(dest, exist_ok=True)
        for name in ("libfvattn.so.1", "libfvattn_jax.so"):
            path = os.path.join(src, name)
            if os.path.exists(path):
                # copy2 follows the libfvattn.so.1 -> libfvattn.so.0.1.0 link: the file itself ships.
                shutil.copy2(path, os.path.join(dest, name))


setup(cmdclass={"build_py": BuildPyWithLibraries})
