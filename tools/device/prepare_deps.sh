#!/usr/bin/env bash
# Run HERE (the development machine), from the repo root, before a device run: the GPU machine
# cannot reach a package registry, so the header-only build dependencies (fmt, doctest; CLI11 and
# nlohmann-json for the fvattn tool) travel with
# the working tree in .device-deps/ (git-ignored via .git/info/exclude; name it in the run's carry).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.device-deps/' .git/info/exclude 2>/dev/null || echo '/.device-deps/' >> .git/info/exclude
rm -rf .device-deps
d=.device-deps/usr
mkdir -p $d/include $d/lib/x86_64-linux-gnu/cmake $d/lib/cmake $d/share/cmake
cp -r /usr/include/fmt /usr/include/doctest /usr/include/CLI /usr/include/nlohmann $d/include/
cp -r /usr/lib/x86_64-linux-gnu/cmake/fmt $d/lib/x86_64-linux-gnu/cmake/
cp -a /usr/lib/x86_64-linux-gnu/libfmt.so* $d/lib/x86_64-linux-gnu/
cp -r /usr/lib/cmake/doctest $d/lib/cmake/
# CLI11's and nlohmann-json's configs find their prefix from where they lie (share/cmake/<name>).
cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json $d/share/cmake/
# Debian's doctest package hard-codes its prefix (/usr); make the copy find itself where it lands.
sed -i 's|set(_IMPORT_PREFIX "/usr")|get_filename_component(_IMPORT_PREFIX "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)|' \
  $d/lib/cmake/doctest/doctestTargets.cmake
du -sh .device-deps
