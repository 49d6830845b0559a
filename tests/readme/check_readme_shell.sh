#!/usr/bin/env bash
# The README's shell recipe for the Python package, run as written, as a new user runs it: from the
# repository root of a clean clone (CI's checkout, after `tools/dev.sh test` built `build/`), with
# `pip` a fresh virtual environment's. Then checks what the recipe promises:
#   1. the installed package loads the library bundled in it, from any directory, with
#      FVATTN_LIBRARY, PYTHONPATH and LD_LIBRARY_PATH unset, and runs the README's first Python
#      example there;
#   2. a later `pip install ./bindings/python` without FVATTN_BUNDLE_DIR (into a second environment)
#      ships no library: nothing left in the build folder by the bundled install leaks into it;
#   3. the recipe leaves no untracked file in the source tree (`git status`).
# Needs network access for pip (the environments start empty) and python3-venv.
#   tests/readme/check_readme_shell.sh            (from anywhere; exits non-zero on any failure)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check_readme_shell: FAIL: $*" >&2; exit 1; }

# The first ```sh block after the heading "## From Python", and the first ```python block after it.
block() {  # block LANG
  awk -v lang="$1" '/^## From Python/ {on = 1} on && $0 == "```" lang {inb = 1; next}
                    inb && /^```/ {exit} inb {print}' README.md
}
block sh > "$tmp/recipe.sh"
block python > "$tmp/example.py"
[ -s "$tmp/recipe.sh" ] || fail "README.md: no \`\`\`sh block under '## From Python'"
[ -s "$tmp/example.py" ] || fail "README.md: no \`\`\`python block under '## From Python'"
echo "== the recipe, as the README writes it:"
cat "$tmp/recipe.sh"

clean_env() {  # clean_env VENV COMMAND...: run with the environment's python, nothing of the build
  local venv=$1; shift
  env -u FVATTN_LIBRARY -u FVATTN_JAX_LIBRARY -u PYTHONPATH -u LD_LIBRARY_PATH \
    PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" "$@"
}
untracked_before=$(git status --porcelain --untracked-files=all)

python3 -m venv "$tmp/venv"
clean_env "$tmp/venv" bash -euo pipefail "$tmp/recipe.sh" || fail "the recipe failed"

# 1. The bundled library, from another directory.
site=$(clean_env "$tmp/venv" python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cd "$tmp"
lib=$(clean_env "$tmp/venv" python -c 'import fvattn; print(fvattn.library_path())') ||
  fail "the installed package does not load"
[ "$lib" = "$site/fvattn/_lib/libfvattn.so.1" ] || fail "fvattn loaded $lib, not its bundled library"
clean_env "$tmp/venv" python "$tmp/example.py" || fail "the README's first Python example failed"
cd "$root"
echo "== installed; fvattn loads $lib; the README's example runs"

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
