#!/usr/bin/env bash
# Sets up a Debian 12 (or Ubuntu) machine to build kiln, then configures and builds it.
#
#   scripts/setup.sh                      install what is missing, configure build/, build everything
#   scripts/setup.sh -DKILN_MPI=OFF       any -D... argument goes to CMake as is
#   scripts/setup.sh --no-deps            skip the package step (a machine set up by hand)
#   scripts/setup.sh --deps-only          only install the packages
#   scripts/setup.sh --no-build           install and configure, but do not build
#   scripts/setup.sh --target quickstart  build one target instead of everything
#   scripts/setup.sh --no-test-deps       leave out what only the tests need (scripts/quickstart.sh does)
#   scripts/setup.sh --test-deps          only install what the tests need besides the build (scripts/test.sh does)
#   scripts/setup.sh --fuzz               also install clang and libFuzzer (fuzz/README.md)
#
# Environment (all optional):
#   KILN_BUILD_DIR           build folder (default: build, in the repository root)
#   KILN_BUILD_TYPE          CMake build type on first configure (default: Release)
#   KILN_JOBS                parallel compile jobs (default: the number of cores)
#   KILN_CUDA                ON, OFF or auto (default: auto = ON when nvcc is found)
#   KILN_CUDA_ARCHITECTURES  CMAKE_CUDA_ARCHITECTURES when CUDA is on (default: 90, the H200)
#
# Packages come from apt, only those missing; it runs apt as root, or through sudo when not root. What apt lacks comes
# from PyPI into the git-ignored third_party/ (NVIDIA's headers, ONNX's onnx.proto; the tests' Python packages
# tensorboard, onnx and onnxruntime into third_party/python), and CLI11, ISA-L and protobuf are copied there from
# their Debian packages: a machine without a package source (the GPU machine) builds from the working tree plus
# third_party/ (for ONNX export: third_party/onnx and third_party/protobuf).
# Running it again is cheap: nothing is installed twice, and an existing build folder keeps its
# settings (only -D arguments given now change them).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

say() { echo "setup.sh: $*"; }
die() { echo "setup.sh: error: $*" >&2; exit 1; }

do_deps=1
do_configure=1
do_build=1
do_fuzz=0
do_test_deps=1
target=""
cmake_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-deps) do_deps=0 ;;
    --deps-only) do_configure=0; do_build=0 ;;
    --no-build) do_build=0 ;;
    --fuzz) do_fuzz=1 ;;
    --no-test-deps) do_test_deps=0 ;;
    --test-deps) do_test_deps=2 ;;
    --target) [[ $# -ge 2 ]] || die "--target needs a target name"; target="$2"; shift ;;
    -D*) cmake_args+=("$1") ;;
    -h | --help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (try --help)" ;;
  esac
  shift
done

build_dir="${KILN_BUILD_DIR:-build}"
build_type="${KILN_BUILD_TYPE:-Release}"
jobs="${KILN_JOBS:-$(nproc 2>/dev/null || echo 2)}"

# ---------------------------------------------------------------- packages
# Debian package -> a probe that says it is already there without asking dpkg, so that a machine
# with tools installed another way (CMake from pip or Kitware, say) is not sent to apt for them.
# Required to build and test; the optional ones only speed up or tidy (ccache, clang-format, git).
# libcli11-dev: the examples' and tools' option parsing; libisal-dev: ISA-L's CRC-32C for TensorBoard event files.
# python3: CMake runs tests/docs/check_snippets.py when it configures (the documentation's programs).
# libprotobuf-dev, protobuf-compiler: ONNX export (io::export_onnx) writes ONNX's protobuf messages; protoc generates
# their C++ from onnx.proto (taken from the onnx wheel, below) when kiln builds (-DKILN_ONNX=OFF builds without both).
required=(cmake ninja-build g++ make pkg-config python3 libeigen3-dev libhdf5-dev libopenmpi-dev openmpi-bin
          libgtest-dev googletest libjpeg-dev libpng-dev zlib1g-dev nlohmann-json3-dev libcli11-dev libisal-dev
          libprotobuf-dev protobuf-compiler)
# python3-pip fetches the parts kiln takes from PyPI (nvml.h, cudnn-frontend, onnx.proto; the tests' Python packages)
# into third_party/.
optional=(ccache clang-format git python3-pip)
# Only the tests need these (left out by --no-test-deps): doxygen, for the API reference's check docs.undocumented.
test_packages=(doxygen)
# --fuzz: clang and libFuzzer's runtime (Debian 12 ships it in libclang-rt-14-dev), for fuzz/.
fuzz_packages=(clang libclang-rt-14-dev)

cmake_is_recent() {
  local v
  v="$(cmake --version 2>/dev/null | head -n1 | grep -oE '[0-9]+\.[0-9]+' | head -n1)" || return 1
  [[ -n "$v" ]] || return 1
  local major="${v%%.*}" minor="${v#*.}"
  (( major > 3 || (major == 3 && minor >= 24) ))
}

have_file() { local f; for f in "$@"; do [[ -e "$f" ]] && return 0; done; return 1; }

probe() {
  case "$1" in
    cmake) cmake_is_recent ;;
    ninja-build) command -v ninja >/dev/null ;;
    g++) command -v g++ >/dev/null ;;
    make) command -v make >/dev/null ;;
    pkg-config) command -v pkg-config >/dev/null ;;
    python3) command -v python3 >/dev/null ;;
    ccache) command -v ccache >/dev/null ;;
    doxygen) command -v doxygen >/dev/null ;;
    git) command -v git >/dev/null ;;
    python3-pip) python3 -m pip --version >/dev/null 2>&1 ;;
    clang-format) compgen -c clang-format | grep -qE '^clang-format(-[0-9]+)?$' ;;
    libeigen3-dev) have_file /usr/include/eigen3/Eigen/Core /usr/local/include/eigen3/Eigen/Core ;;
    libhdf5-dev) have_file /usr/include/hdf5/serial/hdf5.h /usr/include/hdf5.h /usr/local/include/hdf5.h ;;
    libopenmpi-dev) command -v mpicxx >/dev/null ;;
    libjpeg-dev) have_file /usr/include/jpeglib.h /usr/include/x86_64-linux-gnu/jpeglib.h /usr/local/include/jpeglib.h ;;
    libpng-dev) have_file /usr/include/png.h /usr/local/include/png.h ;;
    zlib1g-dev) have_file /usr/include/zlib.h /usr/local/include/zlib.h ;;
    nlohmann-json3-dev) have_file /usr/include/nlohmann/json.hpp /usr/local/include/nlohmann/json.hpp ;;
    libcli11-dev) have_file /usr/include/CLI/CLI.hpp /usr/local/include/CLI/CLI.hpp ;;
    libisal-dev) have_file /usr/include/isa-l/crc.h /usr/local/include/isa-l/crc.h ;;
    # protobuf: also the copy in third_party/protobuf (below), with which a machine without a package source builds.
    libprotobuf-dev) have_file /usr/include/google/protobuf/message.h /usr/local/include/google/protobuf/message.h \
                               third_party/protobuf/include/google/protobuf/message.h ;;
    protobuf-compiler) command -v protoc >/dev/null || [[ -x third_party/protobuf/bin/protoc ]] ;;
    openmpi-bin) command -v mpirun >/dev/null ;;
    libgtest-dev | googletest)
      compgen -G '/usr/lib/*/cmake/GTest/GTestConfig.cmake' >/dev/null ||
        compgen -G '/usr/local/lib*/cmake/GTest/GTestConfig.cmake' >/dev/null ||
        have_file /usr/lib/cmake/GTest/GTestConfig.cmake ;;
    *) return 1 ;;
  esac
}

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed' || probe "$1"
}

missing_from() {
  local p
  for p in "$@"; do installed "$p" || echo "$p"; done
}

install_packages() {
  local missing
  local wanted=("${required[@]}" "${optional[@]}")
  if [[ $do_fuzz -eq 1 ]]; then wanted+=("${fuzz_packages[@]}"); fi
  mapfile -t missing < <(missing_from "${wanted[@]}")
  if [[ ${#missing[@]} -eq 0 ]]; then
    say "all build dependencies are already installed"
    return
  fi
  say "installing: ${missing[*]}"
  if apt_install "${missing[@]}"; then return; fi
  # A machine without a package source (the GPU machine, say) can still build when only optional
  # tools are missing.
  local still_missing
  mapfile -t still_missing < <(missing_from "${required[@]}")
  if [[ ${#still_missing[@]} -gt 0 ]]; then
    die "could not install ${still_missing[*]}; install them by hand (as root: apt-get install ${still_missing[*]})"
  fi
  say "warning: could not install the optional ${missing[*]}; building without them"
}

# The test-only Debian packages (test_packages), when missing; a failure is a warning (the build does not need them).
install_test_packages() {
  local missing
  mapfile -t missing < <(missing_from "${test_packages[@]}")
  [[ ${#missing[@]} -eq 0 ]] && return
  say "installing for the tests: ${missing[*]}"
  apt_install "${missing[@]}" ||
    say "warning: could not install ${missing[*]}: the test docs.undocumented will fail until it is installed"
}

# apt-get update + install, as root or through sudo. Returns non-zero (with a message) on failure.
apt_install() {
  if ! command -v apt-get >/dev/null; then
    echo "setup.sh: apt-get not found" >&2
    return 1
  fi
  local as_root=()
  if [[ $(id -u) -ne 0 ]]; then
    if ! command -v sudo >/dev/null; then
      echo "setup.sh: not root and no sudo to run apt-get with" >&2
      return 1
    fi
    as_root=(sudo)
  fi
  if ! "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q; then
    echo "setup.sh: apt-get update failed (no network or no package source?)" >&2
    return 1
  fi
  if ! "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"; then
    echo "setup.sh: apt-get install failed for: $*" >&2
    return 1
  fi
}

# Files taken from PyPI wheels, kept in the git-ignored third_party/<name>/ (sent along to machines without a package
# registry, such as the GPU machine) with a VERSION stamp. Header-only pieces from NVIDIA's wheels:
# - cuDNN's fused attention is used through cudnn-frontend (nvidia-cudnn-frontend, its include/ folder);
# - GPU monitoring (kiln/monitor/nvml/) and kiln-doctor read the driver's NVML library, loaded at run time;
#   only its header is needed to build (nvidia-nvml-dev's nvml.h). Without it kiln builds, and says at run
#   time that GPU monitoring is missing.
# - GPU JPEG decoding (kiln/data/gpu_decode/) loads nvJPEG at run time; nvidia-nvjpeg gives its header to build
#   against and libnvjpeg.so.13 (into third_party/nvjpeg/lib/, where kiln looks first at run time). The 13.0
#   release runs with every CUDA 13 driver. Without it kiln builds, and a GPU decode says how to get it.
# And ONNX's schema: onnx.proto (with the onnx wheel's license) into third_party/onnx/, from which CMake generates
# kiln's C++ for the ONNX messages (KILN_ONNX, ON by default; cmake/kiln_onnx.cmake). The same onnx release is
# installed into third_party/python for the tests (below), so the exporter and the checker read one schema.
cudnn_frontend_version="1.32.0"
nvml_version="13.0.87"
nvjpeg_version="13.0.4.44"
onnx_version="1.23.2"

# install_from_wheel PACKAGE VERSION DIR CHECK_FILE WITHOUT WHAT...
#   Puts the files WHAT names from PACKAGE's wheel into DIR, unless DIR's stamp says VERSION and DIR/CHECK_FILE
#   exists. WITHOUT says what a failure costs. Each WHAT is one of:
#     include   every file under an include/ folder of the wheel, into DIR/include/ (the part after "include/");
#     libs      the shared libraries under the wheel's lib/ folders, into DIR/lib/;
#     licenses  the wheel's license files (*.dist-info/licenses/*), into DIR/;
#     a path    that one file of the wheel (e.g. onnx/onnx.proto), into DIR/.
install_from_wheel() {
  local package="$1" version="$2" dir="$3" check="$4" without="$5"
  shift 5
  local stamp="$dir/VERSION"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$version" && -f "$dir/$check" ]]; then
    say "$package $version is already in $dir"
    return
  fi
  local py
  py="$(command -v python3 || true)"
  if [[ -z "$py" ]] || ! "$py" -m pip --version >/dev/null 2>&1; then
    say "warning: python3 with pip not found: $package not installed ($without)"
    return
  fi
  local tmp
  tmp="$(mktemp -d)"
  say "installing $package $version ($*) from PyPI into $dir"
  if "$py" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "$package==$version" &&
     "$py" - "$tmp" "$dir" "$check" "$@" <<'PY'
import fnmatch, glob, os, shutil, sys, zipfile
tmp, dest, check, *what = sys.argv[1:]
wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
shutil.rmtree(dest, ignore_errors=True)

def target(name):  # where a file of the wheel goes in dest, or None
    base = os.path.basename(name)
    if "libs" in what and "/lib/" in name and ".so" in base:
        return os.path.join("lib", base)
    if "include" in what and "include/" in name:
        return os.path.join("include", name.split("include/", 1)[1])
    if "licenses" in what and fnmatch.fnmatch(name, "*.dist-info/licenses/*"):
        return base
    if name in what:
        return base
    return None

with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        rel = None if name.endswith("/") else target(name)
        if rel is None:
            continue
        path = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with z.open(name) as src, open(path, "wb") as out:
            shutil.copyfileobj(src, out)
if not os.path.isfile(os.path.join(dest, check)):
    sys.exit("setup.sh: no " + check + " from " + os.path.basename(wheel))
PY
  then
    echo "$version" >"$stamp"
  else
    say "warning: could not fetch $package from PyPI: $without"
  fi
  rm -rf "$tmp"
}

# Three of the Debian packages are copied into the git-ignored third_party/ too, so that they travel with the working
# tree to a machine that has no package source (the GPU machine), where CMake looks for them after the system:
# CLI11 (headers and its CMake package) into third_party/cli11, ISA-L (headers and libisal.so*) into
# third_party/isal, and protobuf into third_party/protobuf: its headers, libprotobuf.so*, and protoc (bin/) with the
# libprotoc.so* it runs with, so that the GPU machine generates the ONNX messages' C++ at build time as every other
# machine does (one way to build; the generated code always matches the libprotobuf it links, since both come from
# one copy). CMake runs that protoc with LD_LIBRARY_PATH on third_party/protobuf/lib. About 9 MB.
# A stamp holds the package's version; nothing is copied twice. package_runtime names the packages that hold the
# files beside the -dev package's (its run-time library, the compiler).
stage_package() {
  local package="$1" dir="$2"
  shift 2
  local version
  version="$(dpkg-query -W -f='${Version}' "$package" 2>/dev/null || true)"
  if [[ -z "$version" ]]; then
    say "$package is not installed from a Debian package: not copied into $dir"
    return
  fi
  if [[ -f "$dir/VERSION" && "$(cat "$dir/VERSION")" == "$version" ]]; then
    return
  fi
  rm -rf "$dir"
  local file
  while IFS= read -r file; do
    local keep
    for keep in "$@"; do
      if [[ "$file" == $keep && ( -f "$file" || -L "$file" ) ]]; then
        case "$file" in
          */include/*) mkdir -p "$dir/include/$(dirname "${file#*/include/}")" && cp -P "$file" "$dir/include/${file#*/include/}" ;;
          */bin/*) mkdir -p "$dir/bin" && cp -P "$file" "$dir/bin/" ;;
          */share/cmake/*) mkdir -p "$dir/share/cmake/$(dirname "${file#*/share/cmake/}")" &&
                           cp -P "$file" "$dir/share/cmake/${file#*/share/cmake/}" ;;
          *) mkdir -p "$dir/lib" && cp -P "$file" "$dir/lib/" ;;
        esac
      fi
    done
  done < <(dpkg -L "$package" "${package_runtime[@]}" 2>/dev/null)
  echo "$version" >"$dir/VERSION"
  say "copied $package $version into $dir (for machines without a package source)"
}
stage_offline_packages() {
  package_runtime=()
  stage_package libcli11-dev third_party/cli11 '/usr/include/CLI/*' '/usr/share/cmake/CLI11/*'
  package_runtime=(libisal2)  # the library itself (libisal.so.2), beside the -dev package's libisal.so link
  stage_package libisal-dev third_party/isal '/usr/include/isa-l*' '/usr/lib/*/libisal.so*'
  # The run-time libraries' package names carry their soname (Debian 12: libprotobuf32, libprotoc32): asked of dpkg.
  mapfile -t package_runtime < <(dpkg-query -S '/usr/lib/*/libprotobuf.so.*' '/usr/lib/*/libprotoc.so.*' 2>/dev/null |
                                   cut -d: -f1 | sort -u)
  package_runtime+=(protobuf-compiler)
  stage_package libprotobuf-dev third_party/protobuf '/usr/include/google/protobuf/*' '/usr/lib/*/libprotobuf.so*' \
    '/usr/lib/*/libprotoc.so*' '/usr/bin/protoc'
}

# The Python packages the tests use, installed with pip into third_party/python (git-ignored), not into any system or
# user Python; the tests put it on PYTHONPATH:
# - tensorboard: its own reader checks kiln's event files (monitor.tensorboard_reader);
# - onnx and onnxruntime (CPU): ONNX's checker and ONNX Runtime run the models io::export_onnx writes and compare
#   their outputs with kiln's (tests/io/onnx_check.py: io.onnx_runtime, io.onnx_check_selftest). onnx is the release
#   whose onnx.proto kiln builds with (onnx_version, above).
# One pip call for all of them, so that pip chooses one numpy and one protobuf that suit every one. The stamp names
# every version and the Python they were installed for: a change of either installs them all again.
tensorboard_version="2.20.0"
onnxruntime_version="1.32.0"
python_dir="third_party/python"
install_test_python_packages() {
  local py stamp want
  local packages=("tensorboard==$tensorboard_version" "onnx==$onnx_version" "onnxruntime==$onnxruntime_version")
  py="$(command -v python3 || true)"
  if [[ -z "$py" ]] || ! "$py" -m pip --version >/dev/null 2>&1; then
    say "warning: python3 with pip not found: ${packages[*]} not installed into $python_dir, so the tests" \
      "monitor.tensorboard_reader and io.onnx_* will fail; install python3 and pip (apt-get install python3-pip), then rerun"
    return
  fi
  stamp="$python_dir/KILN_STAMP"
  want="${packages[*]} $("$py" -c 'import sys; print("python%d.%d" % sys.version_info[:2])')"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    say "$want is already in $python_dir"
    return
  fi
  say "installing $want from PyPI into $python_dir (for the tests that read event files and run ONNX models)"
  rm -rf "$python_dir.tmp"
  if "$py" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-warn-script-location \
      --target "$python_dir.tmp" "${packages[@]}"; then
    rm -rf "$python_dir"
    mv "$python_dir.tmp" "$python_dir"
    echo "$want" >"$stamp"
  else
    rm -rf "$python_dir.tmp"
    say "warning: pip could not install ${packages[*]}: the tests monitor.tensorboard_reader and io.onnx_*" \
      "will fail until scripts/setup.sh installs them"
  fi
}

if [[ $do_test_deps -eq 2 ]]; then  # --test-deps: the test-only packages, nothing else
  install_test_packages
  install_test_python_packages
  exit 0
fi

if [[ $do_deps -eq 1 ]]; then
  install_packages
  stage_offline_packages
  install_from_wheel nvidia-nvml-dev "$nvml_version" third_party/nvml include/nvml.h \
    "kiln builds without GPU monitoring" include
  install_from_wheel nvidia-nvjpeg "$nvjpeg_version" third_party/nvjpeg include/nvjpeg.h \
    "kiln builds without GPU JPEG decoding (images decode on the CPU)" include libs
  install_from_wheel onnx "$onnx_version" third_party/onnx onnx.proto \
    "kiln needs it for ONNX export: configure with -DKILN_ONNX=OFF to build without" onnx/onnx.proto licenses
  if [[ $do_test_deps -eq 1 ]]; then
    install_test_packages
    install_test_python_packages
  fi
  if [[ "${KILN_CUDA:-auto}" != OFF ]] && { command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; }; then
    install_from_wheel nvidia-cudnn-frontend "$cudnn_frontend_version" third_party/cudnn_frontend \
      include/cudnn_frontend.h "GPUs use the math attention path" include
  fi
fi

# ---------------------------------------------------------------- configure
if [[ $do_configure -eq 1 ]]; then
  command -v cmake >/dev/null || die "cmake not found (run without --no-deps to install it)"
  args=(-S . -B "$build_dir")
  if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
    # First configure: choose generator, build type, compiler cache and CUDA. Later runs keep them.
    if command -v ninja >/dev/null; then args+=(-G Ninja); fi
    args+=("-DCMAKE_BUILD_TYPE=$build_type")

    # ccache speeds up rebuilds, but only where its cache folder is writable (CI sandboxes may not be).
    if command -v ccache >/dev/null; then
      cache_dir="$(ccache -k cache_dir 2>/dev/null || true)"
      if [[ -n "$cache_dir" ]] && mkdir -p "$cache_dir" 2>/dev/null && [[ -w "$cache_dir" ]]; then
        say "compiler cache: ccache ($cache_dir)"
      else
        say "ccache's folder '${cache_dir}' is not writable: building without ccache"
        args+=(-DKILN_CCACHE=OFF)
      fi
    fi

    nvcc="$(command -v nvcc || true)"
    if [[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]]; then nvcc=/usr/local/cuda/bin/nvcc; fi
    cuda="${KILN_CUDA:-auto}"
    for a in "${cmake_args[@]}"; do
      if [[ "$a" == -DKILN_CUDA=* || "$a" == -DKILN_CUDA:BOOL=* ]]; then cuda="${a#*=}"; fi
    done
    case "${cuda^^}" in
      ON | TRUE | YES | 1) cuda=ON ;;
      OFF | FALSE | NO | 0) cuda=OFF ;;
      AUTO) cuda=auto ;;
      *) die "KILN_CUDA must be ON, OFF or auto, not '$cuda'" ;;
    esac
    if [[ "$cuda" == auto ]]; then
      if [[ -n "$nvcc" ]]; then cuda=ON; else cuda=OFF; fi
    fi
    args+=("-DKILN_CUDA=$cuda")
    if [[ "$cuda" == ON ]]; then
      [[ -n "$nvcc" ]] || die "KILN_CUDA=ON but nvcc was not found (PATH or /usr/local/cuda/bin)"
      args+=("-DCMAKE_CUDA_COMPILER=$nvcc")
      if [[ " ${cmake_args[*]} " != *" -DCMAKE_CUDA_ARCHITECTURES="* ]]; then
        args+=("-DCMAKE_CUDA_ARCHITECTURES=${KILN_CUDA_ARCHITECTURES:-90}")
      fi
      say "CUDA: on ($nvcc; a GPU is not needed to build)"
    else
      say "CUDA: off (nvcc not found, or KILN_CUDA=OFF)"
    fi
  fi
  say "configuring $build_dir"
  cmake "${args[@]}" "${cmake_args[@]}" || die "CMake configure failed (see the messages above)"
fi

# ---------------------------------------------------------------- build
if [[ $do_build -eq 1 ]]; then
  build_args=(--build "$build_dir" --parallel "$jobs")
  [[ -n "$target" ]] && build_args+=(--target "$target")
  say "building ${target:-everything} in $build_dir with $jobs jobs"
  cmake "${build_args[@]}" || die "build failed (see the compiler messages above)"
  say "done: $build_dir is built"
fi
