// The libraries kiln's programs link, opened by soname the way the dynamic loader would find them
// (LD_LIBRARY_PATH, then this executable's RUNPATH, which holds the folders kiln was linked from, then the
// system's cache), each asked for its version by its own function.
#include <dlfcn.h>
#include <link.h>

#include <cstddef>
#include <functional>
#include <regex>

#include "gather.h"

namespace kiln::doctor {

std::string loaded_path(void* handle) {
  link_map* map = nullptr;
  if (handle && dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name) return map->l_name;
  return {};
}

namespace {

// Reads the version from an opened library: false when the function is not there.
using VersionReader = std::function<bool(void* handle, LibraryFacts* lib)>;

template <class F>
F symbol(void* handle, const char* name) {
  return reinterpret_cast<F>(dlsym(handle, name));
}

void split_version(long v, long major_unit, LibraryFacts* lib) {  // 91400 with unit 10000 -> 9.14.0
  lib->major = static_cast<int>(v / major_unit);
  lib->minor = static_cast<int>((v % major_unit) / 100);
  lib->patch = static_cast<int>(v % 100);
}

void set_built(long v, long major_unit, LibraryFacts* lib) {
  if (v <= 0) return;
  lib->built_major = static_cast<int>(v / major_unit);
  lib->built_minor = static_cast<int>((v % major_unit) / 100);
  lib->built_patch = static_cast<int>(v % 100);
}

// Tries each name in turn (sonames, then a file path); the first that loads is probed.
LibraryFacts probe(std::string name, const std::vector<std::string>& files, bool required, std::string version_function,
                   const VersionReader& read_version) {
  LibraryFacts lib;
  lib.name = std::move(name);
  lib.soname = files.front();
  lib.required = required;
  lib.version_function = std::move(version_function);
  void* handle = nullptr;
  for (const std::string& file : files) {
    if (file.empty()) continue;
    dlerror();
    handle = dlopen(file.c_str(), RTLD_LAZY | RTLD_LOCAL);
    if (handle) break;
    if (lib.load_error.empty()) {
      const char* e = dlerror();
      lib.load_error = e ? e : "dlopen failed";
    }
  }
  if (!handle) return lib;
  lib.found = true;
  lib.load_error.clear();
  lib.path = loaded_path(handle);
  lib.has_version_function = read_version(handle, &lib);
  // Left open: the checks module, loaded later, uses the same copies.
  return lib;
}

bool read_cublas(void* h, LibraryFacts* lib) {
  // cublasGetProperty(libraryPropertyType, int*): MAJOR_VERSION = 0, MINOR_VERSION = 1, PATCH_LEVEL = 2.
  auto get = symbol<int (*)(int, int*)>(h, "cublasGetProperty");
  if (!get) return false;
  int v[3] = {-1, -1, -1};
  for (int i = 0; i < 3; ++i) get(i, &v[i]);
  lib->major = v[0];
  lib->minor = v[1];
  lib->patch = v[2];
  return true;
}

bool read_cublaslt(void* h, LibraryFacts* lib) {
  auto get = symbol<size_t (*)()>(h, "cublasLtGetVersion");
  if (!get) return false;
  split_version(static_cast<long>(get()), 10000, lib);  // major * 10000 + minor * 100 + patch
  return true;
}

bool read_cudnn(void* h, LibraryFacts* lib) {
  auto get = symbol<size_t (*)()>(h, "cudnnGetVersion");
  if (!get) return false;
  const long v = static_cast<long>(get());
  split_version(v, v >= 90000 ? 10000 : 1000, lib);  // cuDNN 9: 91400 = 9.14.0; cuDNN 8: 8907 = 8.9.7
  return true;
}

bool read_nccl(void* h, LibraryFacts* lib) {
  auto get = symbol<int (*)(int*)>(h, "ncclGetVersion");
  if (!get) return false;
  int v = 0;
  if (get(&v) != 0) return true;
  split_version(v, v >= 20900 ? 10000 : 1000, lib);  // 2.9 and later: 22803 = 2.28.3; before: 2804 = 2.8.4
  return true;
}

bool read_hdf5(void* h, LibraryFacts* lib) {
  auto get = symbol<int (*)(unsigned*, unsigned*, unsigned*)>(h, "H5get_libversion");
  if (!get) return false;
  unsigned a = 0, b = 0, c = 0;
  if (get(&a, &b, &c) < 0) return true;
  lib->major = static_cast<int>(a);
  lib->minor = static_cast<int>(b);
  lib->patch = static_cast<int>(c);
  return true;
}

bool read_mpi(void* h, LibraryFacts* lib) {
  // Needs no MPI_Init. The buffer is MPICH's MPI_MAX_LIBRARY_VERSION_STRING (the largest; Open MPI's is 256).
  auto get = symbol<int (*)(char*, int*)>(h, "MPI_Get_library_version");
  if (!get) return false;
  std::string text(8192, '\0');
  int length = 0;
  if (get(text.data(), &length) != 0) return true;
  text.resize(static_cast<size_t>(std::max(0, std::min(length, 8191))));
  std::smatch m;
  if (std::regex_search(text, m, std::regex(R"((\d+)\.(\d+)(?:\.(\d+))?)"))) {
    lib->major = std::stoi(m[1]);
    lib->minor = std::stoi(m[2]);
    lib->patch = m[3].matched ? std::stoi(m[3]) : -1;
  }
  lib->description = text.substr(0, text.find_first_of(",\n"));  // "Open MPI v4.1.4", "MPICH Version: 4.0"
  return true;
}

}  // namespace

std::vector<LibraryFacts> probe_libraries(const BuildFacts& build) {
  std::vector<LibraryFacts> libs;
  if (build.cuda) {
    // The sonames follow the major versions kiln was compiled against; those are what its programs load.
    const int cublas_major = build.cublas_version / 10000;
    const int cudnn_major = build.cudnn_version / 10000;
    const int nccl_major = build.nccl_version >= 20900 ? build.nccl_version / 10000 : build.nccl_version / 1000;
    libs.push_back(
        probe("cuBLAS", {"libcublas.so." + std::to_string(cublas_major)}, true, "cublasGetProperty", read_cublas));
    set_built(build.cublas_version, 10000, &libs.back());
    libs.push_back(probe("cuBLASLt", {"libcublasLt.so." + std::to_string(cublas_major)}, true, "cublasLtGetVersion",
                         read_cublaslt));
    set_built(build.cublas_version, 10000, &libs.back());
    libs.push_back(probe("cuDNN", {"libcudnn.so." + std::to_string(cudnn_major)}, true, "cudnnGetVersion", read_cudnn));
    set_built(build.cudnn_version, 10000, &libs.back());
    libs.push_back(probe("NCCL", {"libnccl.so." + std::to_string(nccl_major)}, true, "ncclGetVersion", read_nccl));
    set_built(build.nccl_version, build.nccl_version >= 20900 ? 10000 : 1000, &libs.back());
  }
  // Reported, not judged by version: their sonames differ between distributions, so the file kiln linked
  // comes first.
  libs.push_back(probe("HDF5",
                       {build.hdf5_library, "libhdf5_serial.so.103", "libhdf5.so.103", "libhdf5.so.310", "libhdf5.so"},
                       false, "H5get_libversion", read_hdf5));
  if (build.mpi) {
    libs.push_back(probe("MPI", {build.mpi_library, "libmpi.so.40", "libmpi.so.12", "libmpi.so"}, false,
                         "MPI_Get_library_version", read_mpi));
  }
  for (auto& lib : libs) {  // the first name tried may be a full path: show the soname-like name
    if (lib.soname.empty() || lib.soname.find('/') != std::string::npos) {
      lib.soname = lib.path.empty() ? lib.soname : lib.path.substr(lib.path.find_last_of('/') + 1);
    }
  }
  return libs;
}

}  // namespace kiln::doctor
