#!/usr/bin/env bash
# The shared library's binary contract: SONAME libfvattn.so.<FVA_ABI_VERSION of the header>, only
# fva_* symbols exported (under the FVATTN_1 version node), and no run-time dependency beyond libc,
# libm and the C++ runtime (no libcuda, libcudart or libfmt: the driver is opened with dlopen, fmt
# is header-only).
# usage: check_exports.sh <libfvattn.so> <fvattn.h> [sanitizers]; a sanitized build (third argument,
# e.g. "address,undefined") may also need exactly those sanitizers' runtimes.
set -euo pipefail
lib="$1"
header="$2"
sanitize="${3:-}"
fail=0
abi=$(sed -n 's/^#define FVA_ABI_VERSION \([0-9]*\).*/\1/p' "$header")
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
if [ "$soname" != "libfvattn.so.$abi" ]; then echo "SONAME is '$soname', expected libfvattn.so.$abi (FVA_ABI_VERSION)"; fail=1; fi
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | sort -u)
bad=$(echo "$exported" | grep -v -E '^(fva_[a-z0-9_]+|FVATTN_1)$' || true)
if [ -n "$bad" ]; then echo "symbols exported besides fva_*:"; echo "$bad"; fail=1; fi
# Exactly the functions the public header declares, no more, no fewer.
declared=$(grep -o '^FVA_API [^(]*fva_[a-z0-9_]*(' "$header" | sed -E 's/.*[ *](fva_[a-z0-9_]+)\($/\1/' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$exported" | grep '^fva_'))
extra=$(comm -13 <(echo "$declared") <(echo "$exported" | grep '^fva_'))
if [ -n "$missing" ]; then echo "declared in fvattn.h but not exported:"; echo "$missing"; fail=1; fi
if [ -n "$extra" ]; then echo "exported but not declared in fvattn.h:"; echo "$extra"; fail=1; fi
n=$(echo "$declared" | grep -c '^fva_' || true)
unversioned=$(nm -D --defined-only "$lib" | awk '$3 ~ /^fva_/ && $3 !~ /@@FVATTN_1$/ {print $3}')
if [ -n "$unversioned" ]; then echo "fva_ symbols outside version node FVATTN_1:"; echo "$unversioned"; fail=1; fi
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
allowed='libc\.so\.6|libm\.so\.6|libstdc\+\+\.so\.6|libgcc_s\.so\.1|ld-linux-x86-64\.so\.2|libdl\.so\.2|libpthread\.so\.0'
case ",$sanitize," in *,address,*) allowed="$allowed|libasan\.so\.[0-9]+" ;; esac
case ",$sanitize," in *,undefined,*) allowed="$allowed|libubsan\.so\.[0-9]+" ;; esac
badneed=$(echo "$needed" | grep -v -E "^($allowed)\$" || true)
if [ -n "$badneed" ]; then echo "unexpected run-time dependencies:"; echo "$badneed"; fail=1; fi
[ $fail -eq 0 ] && echo "exports OK: SONAME $soname, $n fva_ symbols @FVATTN_1, needs: $(echo $needed)"
exit $fail
