"""Where the package finds libfvattn, and what it says when it finds none."""
import os
import subprocess
import sys

import fvattn


def run_python(code, env_update):
    env = {k: v for k, v in os.environ.items() if k not in ("FVATTN_LIBRARY", "LD_LIBRARY_PATH")}
    env.update(env_update)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_fvattn_library_is_used():
    assert os.path.samefile(fvattn.library_path(), os.environ["FVATTN_LIBRARY"])
    assert fvattn.library_version() == 100  # 0.1.0
    assert fvattn.info()["backend"] == "cpu"


def test_no_library_lists_every_place_tried():
    code = ("import fvattn\n"
            "try:\n    fvattn.library_version()\n"
            "except fvattn.LibraryNotFoundError as e:\n    print(e.status_name); print(e.message)\n")
    r = run_python(code, {"FVATTN_LIBRARY": "/nonexistent/libfvattn.so.1"})
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("FVATTN_LIBRARY_NOT_FOUND\ncould not load libfvattn.so.1; tried:\n")
    assert "FVATTN_LIBRARY=/nonexistent/libfvattn.so.1: /nonexistent/libfvattn.so.1 does not exist" in out
    assert "the installed package: " in out and os.path.join("fvattn", "_lib", "libfvattn.so.1") in out
    assert "the loader's search path: libfvattn.so.1: " in out


def test_loader_path_is_the_last_resort():
    lib_dir = os.path.dirname(os.environ["FVATTN_LIBRARY"])
    r = run_python("import fvattn; print(fvattn.library_path())", {"LD_LIBRARY_PATH": lib_dir})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "libfvattn.so.1"


def test_handle_options_from_the_environment():
    keep = {"FVATTN_LIBRARY": os.environ["FVATTN_LIBRARY"]}
    for var, value in (("FVATTN_KERNELS", "fast"), ("FVATTN_DETERMINISTIC", "yes")):
        code = "import fvattn\ntry:\n    fvattn.info()\nexcept ValueError as e:\n    print(e)\n"
        r = run_python(code, dict(keep, **{var: value}))
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"{var}={value!r}: expected"), r.stdout
    for value in ("0", "1"):
        r = run_python("import fvattn; print(fvattn.info()['backend'])",
                       dict(keep, FVATTN_DETERMINISTIC=value, FVATTN_KERNELS="portable"))
        assert r.returncode == 0 and r.stdout.strip() == "cpu", r.stderr


def test_import_needs_no_library():
    r = run_python("import fvattn; print(fvattn.QatConfig().p_scale)", {"FVATTN_LIBRARY": "/nonexistent"})
    assert r.returncode == 0 and r.stdout.strip() == "block", r.stderr
