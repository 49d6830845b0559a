#!/usr/bin/env bash
# cuobjdump and nvdisasm where the CUDA toolkit at hand has none (an nvcc-only install, as on the
# development machines and in CI): NVIDIA's own builds from their PyPI wheels
# (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm; Linux x86-64), fetched once into a cache folder.
# Prints the folder that holds both, for PATH; where both are already on PATH, prints theirs.
#   PATH="$(tools/sass_tools.sh):$PATH" cuobjdump --dump-sass build/kernels/fvattn_sm90.fatbin
#   PATH="$(tools/sass_tools.sh):$PATH" tools/device/check_images.sh build/kernels
# Environment: SASS_TOOLS_VERSION (default 13.5.37: newer tools read older toolkits' images),
# SASS_TOOLS_CACHE (default ~/.cache/fvattn/sass-tools-VERSION).
set -euo pipefail
if command -v cuobjdump > /dev/null && command -v nvdisasm > /dev/null; then
  dirname "$(command -v cuobjdump)"
  exit 0
fi
version=${SASS_TOOLS_VERSION:-13.5.37}
cache=${SASS_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fvattn/sass-tools-$version}
if [ -x "$cache/cuobjdump" ] && [ -x "$cache/nvdisasm" ]; then
  echo "$cache"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "sass_tools: fetching cuobjdump and nvdisasm $version from PyPI" >&2
python3 -m pip download -q --no-deps --disable-pip-version-check -d "$tmp/wheels" \
  "nvidia-cuda-cuobjdump==$version" "nvidia-cuda-nvdisasm==$version" >&2
for w in "$tmp"/wheels/*.whl; do python3 -m zipfile -e "$w" "$tmp/unpacked"; done
mkdir -p "$cache"
for tool in cuobjdump nvdisasm; do
  found=$(find "$tmp/unpacked" -type f -path "*/bin/$tool" | head -n 1)
  [ -n "$found" ] || { echo "sass_tools: the $tool wheel holds no bin/$tool" >&2; exit 1; }
  install -m 755 "$found" "$cache/$tool"
done
"$cache/cuobjdump" --version > /dev/null
echo "$cache"
