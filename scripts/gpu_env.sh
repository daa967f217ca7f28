# Sourced by the GPU scripts (gpu_check.sh, gpu_focus.sh, gpu_examples.sh as they need): the repository root as the
# working folder, the log folder ($OUT on the GPU runner, else ./gpu-logs), the build folder, NVLink multicast off
# in every process (shared hosts: see GPU.md), and note(), which prints a line and keeps it in the summary.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-$root/gpu-logs}"
mkdir -p "$out"
build="${KILN_GPU_BUILD_DIR:-build-gpu}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

# The GPU runner brings back at most 8 files from $OUT (/work/.library/device/README.md). pack_logs, called last
# by the scripts, leaves summary.txt beside logs.tar.gz (every other file, packed) when there are more.
pack_logs() {
  local files
  mapfile -t files < <(cd "$out" && find . -maxdepth 1 -type f ! -name summary.txt ! -name logs.tar.gz -printf '%P\n')
  if (( ${#files[@]} + 1 > 8 )); then
    (cd "$out" && tar -czf logs.tar.gz "${files[@]}" && rm -f "${files[@]}")
    echo "logs packed into $out/logs.tar.gz (${#files[@]} files)"
  fi
}
