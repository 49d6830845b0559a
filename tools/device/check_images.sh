#!/usr/bin/env bash
# The kernel images of a build (tools/gpu-check's sass step, and CI's; runs anywhere cuobjdump and
# nvdisasm do: tools/sass_tools.sh fetches both where the toolkit has none):
#   tools/device/check_images.sh BUILD/kernels
# Every portable family's fatbin (qat, vsa, prep, layer) must hold SASS for each release
# architecture and the compute_80 PTX, its PTX-only fatbin that PTX; the sm90 family SASS for
# sm_90a alone, with wgmma (HGMMA) instructions in it. Prints each fatbin's images and exits non-zero on
# anything missing.
set -uo pipefail
dir=${1:?usage: check_images.sh BUILD/kernels}
want="sm_80 sm_86 sm_89 sm_90a sm_100f sm_120f"
rc=0
for fam in qat vsa prep layer; do
  f=$dir/fvattn_$fam.fatbin
  elf=$(cuobjdump --list-elf "$f" 2>&1 | grep -oE 'sm_[0-9]+[af]?' | sort -u | tr '\n' ' ')
  ptx=$(cuobjdump --list-ptx "$f" 2>&1 | grep -oE 'sm_[0-9]+|compute_[0-9]+' | sort -u | tr '\n' ' ')
  only=$(cuobjdump --list-ptx "$dir/fvattn_${fam}_ptx.fatbin" 2>&1 | grep -oE 'sm_[0-9]+|compute_[0-9]+' | sort -u | tr '\n' ' ')
  echo "$fam: SASS $elf| PTX $ptx| PTX-only fatbin: $only"
  for a in $want; do
    # cuobjdump may name a family or arch-specific image without its suffix.
    grep -qE "(^| )${a}( |$)|(^| )${a%[af]}( |$)" <<< "$elf" || { echo "  missing SASS $a"; rc=1; }
  done
  grep -qE '(sm|compute)_80' <<< "$ptx" || { echo "  missing the compute_80 PTX"; rc=1; }
  grep -qE '(sm|compute)_80' <<< "$only" || { echo "  the PTX-only fatbin holds no compute_80 PTX"; rc=1; }
done
sm90=$(cuobjdump --list-elf "$dir/fvattn_sm90.fatbin" 2>&1 | grep -oE 'sm_[0-9]+a?' | sort -u | tr '\n' ' ')
echo "sm90: SASS $sm90"
[ "$sm90" = "sm_90a " ] || { echo "  the sm90 family must hold SASS for sm_90a alone"; rc=1; }
hgmma=$(cuobjdump --dump-sass "$dir/fvattn_sm90.fatbin" 2>&1 | grep -c HGMMA)
echo "sm90: $hgmma HGMMA instructions"
[ "$hgmma" -gt 0 ] || { echo "  the sm90 family holds no wgmma"; rc=1; }
[ $rc -eq 0 ] && echo "every family holds SASS for: $want, and PTX compute_80"
exit $rc
