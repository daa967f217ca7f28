#!/usr/bin/env bash
# Builds the fuzz targets that link kiln in minutes rather than the KILN_FUZZ build's hour on two cores: the sources
# a target tests and the target itself are compiled here with libFuzzer, ASan and UBSan; the rest of kiln comes
# uninstrumented from a Release build's libkiln (shared or static; gcc or clang). The instrumented copies of those
# sources, linked into the target, take the place of libkiln's own (every kiln symbol is visible and the
# executable's definitions come first), so libkiln's other code calls them too.
#   fuzz/build_against_release.sh [release-build-folder=build] [out-folder=build-fuzz-quick] [target...]
# Targets: fuzz_checkpoint fuzz_checkpoint_sealed (the default: both) fuzz_torch_file fuzz_torch_pickle.
set -euo pipefail
release=${1:-build}
out=${2:-build-fuzz-quick}
shift $(($# < 2 ? $# : 2))
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(fuzz_checkpoint fuzz_checkpoint_sealed)
root=$(cd "$(dirname "$0")/.." && pwd)
release=$(cd "$release" && pwd)
mkdir -p "$out"
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$root" -I"$root/tests" -I"$release/include" -isystem /usr/include/hdf5/serial -isystem /usr/include/eigen3)
if [[ -f $release/kiln/libkiln.so ]]; then
  lib=("$release/kiln/libkiln.so" -Wl,-rpath,"$release/kiln")
elif [[ -f $release/kiln/libkiln.a ]]; then
  lib=("$release/kiln/libkiln.a")
else
  echo "build_against_release.sh: no libkiln in $release/kiln (build the kiln target there first)" >&2
  exit 2
fi
libs=("${lib[@]}" -L/usr/lib/x86_64-linux-gnu/hdf5/serial -Wl,-rpath,/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5
      -ljpeg -lpng -lz -lpthread -ldl -lm)
io="$root/kiln/io"
pids=()
for target in "${targets[@]}"; do
  case $target in
    fuzz_checkpoint | fuzz_checkpoint_sealed)
      src=("$root/fuzz/fuzz_checkpoint.cpp" "$io/checkpoint.cpp" "$io/checkpoint_header.cpp" "$io/checkpoint_parts.cpp"
           "$io/checkpoint_manager.cpp" "$io/hdf5_tensors.cpp") ;;
    fuzz_torch_file | fuzz_torch_pickle)
      src=("$root/fuzz/fuzz_torch_file.cpp" "$io/torch_file.cpp" "$io/pickle_reader.cpp" "$io/zip_reader.cpp") ;;
    *) echo "build_against_release.sh: no target $target" >&2; exit 2 ;;
  esac
  defs=()
  [[ $target == fuzz_checkpoint_sealed ]] && defs=(-DKILN_FUZZ_SEALED)
  [[ $target == fuzz_torch_pickle ]] && defs=(-DKILN_FUZZ_PICKLE)
  clang++ "${flags[@]}" "${defs[@]}" "${src[@]}" "${libs[@]}" -o "$out/$target" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done  # set -e: a failed compile stops here
echo "built ${targets[*]/#/$out/}"
