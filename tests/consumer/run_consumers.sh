#!/usr/bin/env bash
# Installs the build into a staging prefix, then builds and runs the downstream consumers against
# that installation only: the C99 program (cc -std=c99 -pedantic -Werror), a find_package(fvattn)
# CMake project, and a pkg-config link.
# usage: run_consumers.sh <build dir> <tests/consumer dir> [cc] [sanitizer flags]; a sanitized
# library needs its consumers built with the same -fsanitize flags.
set -euo pipefail
build_dir="$1"; src_dir="$2"; cc="${3:-cc}"; san="${4:-}"
stage="$build_dir/consumer-stage"
rm -rf "$stage" "$build_dir/consumer-fp"
cmake --install "$build_dir" --prefix "$stage" >/dev/null
libdir=$(dirname "$(find "$stage" -name 'libfvattn.so' | head -n1)")

# The C99 program takes its flags from the installed fvattn.pc, which checks that file too.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
pkg-config --exists fvattn
cflags=$(pkg-config --cflags fvattn)
libs=$(pkg-config --libs fvattn)
echo "pkg-config fvattn: $cflags $libs"
case "$cflags" in *"$stage"*) ;; *) echo "fvattn.pc does not point into the installation"; exit 1 ;; esac
# -g: the valgrind test that runs this program afterwards names source lines.
# shellcheck disable=SC2086
"$cc" -std=c99 -Wall -Wextra -Werror -pedantic -g $san $cflags "$src_dir/c99_consumer.c" $libs -lm \
  -Wl,-rpath,"$libdir" -o "$build_dir/c99_consumer"

# The README's C example compiles as C99 against the installed header.
readme="$src_dir/../../README.md"
awk '/^```c$/{on=1; next} /^```$/{on=0} on' "$readme" > "$build_dir/readme_example.c"
[ -s "$build_dir/readme_example.c" ] || { echo "no C example found in README.md"; exit 1; }
# shellcheck disable=SC2086
"$cc" -std=c99 -Wall -Wextra -Werror -pedantic -D_ISOC11_SOURCE $cflags -c "$build_dir/readme_example.c" \
  -o "$build_dir/readme_example.o"
echo "README C example: compiles"
"$build_dir/c99_consumer"

cmake -S "$src_dir/find_package" -B "$build_dir/consumer-fp" -DCMAKE_PREFIX_PATH="$stage" \
  -DCMAKE_BUILD_RPATH="$libdir" -DCMAKE_CXX_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san" >/dev/null
cmake --build "$build_dir/consumer-fp" >/dev/null
"$build_dir/consumer-fp/consumer"
