"""`python -m fvattn info`: where the package found libfvattn, its version, and what each backend
this machine has runs (the CPU backend always; a CUDA device's kernel image and why). Exit status 0
when the library loads, 1 when it does not (the message says where it looked)."""
import sys

USAGE = "usage: python -m fvattn info"


def info():
    import fvattn
    try:
        path = fvattn.library_path()
    except fvattn.Error as e:
        print(f"fvattn {fvattn.__version__}: {e}", file=sys.stderr)
        return 1
    v = fvattn.library_version()
    print(f"fvattn {fvattn.__version__} (package {fvattn.__file__})")
    print(f"library: {path} (version {v // 10000}.{v // 100 % 100}.{v % 100})")
    try:
        from . import _library
        print(f"JAX handlers: {_library.jax_handlers()[1]}")
    except Exception as e:  # noqa: BLE001 - reported, not fatal: JAX is optional
        print(f"JAX handlers: not available ({e})")
    cpu = fvattn.info("cpu")
    print(f"CPU backend: {cpu['sm_count']} worker threads")
    try:
        gpu = fvattn.info("cuda", 0)
    except fvattn.Error as e:
        print(f"CUDA: {e.message}")
    else:
        print(f"CUDA device {gpu['device']}: {gpu['device_name']} (sm_{gpu['sm'][0]}{gpu['sm'][1]}, "
              f"{gpu['sm_count']} SMs), kernel image {gpu['image']}: {gpu['image_reason']}")
    return 0


def main(argv):
    if argv[1:] in (["info"], []):
        return info()
    print(USAGE, file=sys.stderr)
    return 0 if argv[1:] in (["-h"], ["--help"]) else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
