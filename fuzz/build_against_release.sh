#!/usr/bin/env bash
# Builds fuzz_checkpoint and fuzz_checkpoint_sealed in minutes rather than the KILN_FUZZ build's hour on two
# cores: the checkpoint sources of kiln_io (checkpoint*.cpp, hdf5_tensors.cpp) and the target are compiled here
# with libFuzzer, ASan and UBSan; the other kiln libraries come uninstrumented from a Release build (gcc or clang).
#   fuzz/build_against_release.sh [release-build-folder=build] [out-folder=build-fuzz-quick]
set -euo pipefail
release=${1:-build}
out=${2:-build-fuzz-quick}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$root" -I"$release/include" -isystem /usr/include/hdf5/serial -isystem /usr/include/eigen3)
sources=("$root"/kiln/io/checkpoint.cpp "$root"/kiln/io/checkpoint_header.cpp "$root"/kiln/io/checkpoint_parts.cpp
         "$root"/kiln/io/checkpoint_manager.cpp "$root"/kiln/io/hdf5_tensors.cpp)
libs=("$release"/kiln/optim/libkiln_optim.a "$release"/kiln/layers/libkiln_layers.a
      "$release"/kiln/autograd/libkiln_autograd.a "$release"/kiln/data/libkiln_data.a
      "$release"/kiln/tensor/libkiln_tensor.a
      -L/usr/lib/x86_64-linux-gnu/hdf5/serial -Wl,-rpath,/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5
      -ljpeg -lpng -lz -lpthread -ldl -lm)
pids=()
for target in fuzz_checkpoint fuzz_checkpoint_sealed; do
  defs=()
  [[ $target == fuzz_checkpoint_sealed ]] && defs=(-DKILN_FUZZ_SEALED)
  clang++ "${flags[@]}" "${defs[@]}" "$root/fuzz/fuzz_checkpoint.cpp" "${sources[@]}" "${libs[@]}" -o "$out/$target" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done  # set -e: a failed compile stops here
echo "built $out/fuzz_checkpoint $out/fuzz_checkpoint_sealed"
