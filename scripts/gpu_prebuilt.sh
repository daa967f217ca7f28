#!/usr/bin/env bash
# Builds GPU binaries on the development machine, so that a run on the GPU machine spends its device time on tests
# and benchmarks instead of a build (about three minutes of a focused run there):
#
#   scripts/gpu_prebuilt.sh test_layers test_tensor bench_train      # then carry "gpu-carry" to the GPU run
#   scripts/gpu_prebuilt.sh test_data bench_train kernel_trace       # a library target: build/bench/libkernel_trace.so
#
# Builds the targets in build/ (configured as the GPU scripts configure: CUDA on, Release, sm_90) and packs them
# with libkiln into gpu-carry/prebuilt.tar.xz (ignored by git), beside prebuilt.id, a fingerprint of the sources
# (source_id in gpu_env.sh), and prebuilt.targets. On the GPU machine gpu_focus.sh unpacks them into build/, where
# their run path finds libkiln, when the fingerprint matches the tree it received, every target it needs is there
# and every library they need loads (ldd); otherwise it builds there as before. Binaries built on Debian 12 run on
# the GPU machine's newer system (GPU.md); a library it lacks shows in ldd, and the run then builds natively.
set -euo pipefail

# shellcheck source=scripts/gpu_env.sh
OUT="${OUT:-$(mktemp -d)}" source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # root, note, source_id

targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || { echo "usage: scripts/gpu_prebuilt.sh TARGET... (test binaries, benchmarks, examples)" >&2; exit 2; }
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build "$root/build" --target kiln "${targets[@]}"
files=()
while IFS= read -r f; do files+=("${f#"$root"/}"); done < <(find "$root/build/kiln" -maxdepth 1 -name 'libkiln.so*')
for t in "${targets[@]}"; do
  # An executable named TARGET, or a shared library libTARGET.so (kernel_trace's CUPTI injection library).
  exe="$(find "$root/build/tests" "$root/build/bench" "$root/build/examples" \( -name "$t" -o -name "lib$t.so" \) \
    -type f -perm -u+x 2>/dev/null | head -n1)"
  [[ -n "$exe" ]] || {
    echo "gpu_prebuilt.sh: no executable $t or library lib$t.so under build/tests, build/bench or build/examples" >&2
    exit 1
  }
  files+=("${exe#"$root"/}")
done
# The system libraries they load, under their sonames in build/prebuilt-libs/, for a GPU machine that lacks some
# (libjpeg, libisal): use_prebuilt puts the missing ones, and only those, on the library path there. The C and C++
# runtimes and the CUDA libraries are the GPU machine's own, except CUPTI.
rm -rf "$root/build/prebuilt-libs"
mkdir -p "$root/build/prebuilt-libs"
while read -r soname path; do
  case "$soname" in
    libc.so.* | libm.so.* | libstdc++.so.* | libgcc_s.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) continue ;;
  esac
  # CUPTI too (kernel_trace's), which a GPU machine with the CUDA runtime may lack.
  [[ "$path" == /usr/lib/* || "$path" == /lib/* || "$soname" == libcupti.so.* ]] || continue
  cp -L "$path" "$root/build/prebuilt-libs/$soname"
done < <(cd "$root" && ldd "${files[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u)
files+=(build/prebuilt-libs)
mkdir -p "$root/gpu-carry"
(cd "$root" && tar -cf - "${files[@]}" | xz -6 -T0 >gpu-carry/prebuilt.tar.xz)
source_id >"$root/gpu-carry/prebuilt.id"
echo "${targets[*]}" >"$root/gpu-carry/prebuilt.targets"
echo "gpu_prebuilt.sh: gpu-carry/prebuilt.tar.xz ($(du -h "$root/gpu-carry/prebuilt.tar.xz" | cut -f1)): ${files[*]}"
