#!/usr/bin/env bash
# The README's shell recipes for the Python package, run as written, as a new user runs them: from
# the repository root of a clean clone (CI's checkout, after `tools/dev.sh test` built `build/`),
# each ```sh block under "## From Python" in its own fresh virtual environment (`pip` and `python`
# are that environment's). After each, checks what the recipes promise:
#   1. the installed package loads the library inside it, from any directory, with FVATTN_LIBRARY,
#      PYTHONPATH and LD_LIBRARY_PATH unset; `python -m fvattn info` runs; the README's first Python
#      example runs;
#   2. a later `pip install ./bindings/python` without FVATTN_BUNDLE_DIR (into another environment)
#      ships no library: nothing left in the build folder by the bundled install leaks into it;
#   3. the recipes leave no untracked file in the source tree (`git status`).
# The first recipe (`pip install .` at the root) builds the library again (with its CUDA images
# where nvcc is present: minutes on 2 cores). Needs network access for pip and python3-venv.
#   tests/readme/check_readme_shell.sh            (from anywhere; exits non-zero on any failure)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check_readme_shell: FAIL: $*" >&2; exit 1; }

# The ```sh blocks after the heading "## From Python" (up to the next "## "), each into recipe-N.sh,
# and the first ```python block there.
awk -v dir="$tmp" '/^## / {on = ($0 ~ /^## From Python/)} on && $0 == "```sh" {n++; inb = 1; next}
                   inb && /^```/ {inb = 0; next} inb {print > (dir "/recipe-" n ".sh")}' README.md
awk '/^## / {on = ($0 ~ /^## From Python/)} on && $0 == "```python" {inb = 1; next}
     inb && /^```/ {exit} inb {print}' README.md > "$tmp/example.py"
ls "$tmp"/recipe-*.sh > /dev/null 2>&1 || fail "README.md: no \`\`\`sh block under '## From Python'"
[ -s "$tmp/example.py" ] || fail "README.md: no \`\`\`python block under '## From Python'"

clean_env() {  # clean_env VENV COMMAND...: run with the environment's python, nothing of the build
  local venv=$1; shift
  env -u FVATTN_LIBRARY -u FVATTN_JAX_LIBRARY -u PYTHONPATH -u LD_LIBRARY_PATH \
    PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" "$@"
}
untracked_before=$(git status --porcelain --untracked-files=all)

for recipe in "$tmp"/recipe-*.sh; do
  name=$(basename "$recipe" .sh)
  echo "== $name, as the README writes it:"
  cat "$recipe"
  venv=$tmp/venv-$name
  python3 -m venv "$venv"
  clean_env "$venv" bash -euo pipefail "$recipe" || fail "$name failed"
  # 1. The library inside the package, from another directory.
  site=$(clean_env "$venv" python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cd "$tmp"
  lib=$(clean_env "$venv" python -c 'import fvattn; print(fvattn.library_path())') ||
    fail "$name: the installed package does not load"
  [ "$lib" = "$site/fvattn/_lib/libfvattn.so.1" ] || fail "$name: fvattn loaded $lib, not the library inside it"
  clean_env "$venv" python -m fvattn info || fail "$name: python -m fvattn info failed"
  clean_env "$venv" python "$tmp/example.py" || fail "$name: the README's first Python example failed"
  cd "$root"
  echo "== $name: installed; fvattn loads $lib; python -m fvattn info and the README's example run"
done

# 2. No bundle asked for: no library shipped, whatever the first install left in the build folder.
python3 -m venv "$tmp/venv2"
clean_env "$tmp/venv2" pip install -q ./bindings/python || fail "pip install ./bindings/python failed"
site2=$(clean_env "$tmp/venv2" python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ -d "$site2/fvattn" ] || fail "pip install ./bindings/python installed no fvattn package"
if [ -e "$site2/fvattn/_lib" ]; then
  fail "pip install ./bindings/python without FVATTN_BUNDLE_DIR shipped $(ls "$site2/fvattn/_lib")"
fi
echo "== without FVATTN_BUNDLE_DIR the package ships no library"

# 3. Nothing new and untracked in the source tree (build/ and *.egg-info are ignored).
untracked_after=$(git status --porcelain --untracked-files=all)
if [ "$untracked_before" != "$untracked_after" ]; then
  diff <(echo "$untracked_before") <(echo "$untracked_after") >&2 || true
  fail "the recipe left files in the source tree that git does not ignore"
fi
echo "check_readme_shell: PASS"
