// kiln/data/gpu_decode/nvjpeg_library.cpp — finding and loading libnvjpeg.so.13 with dlopen.
#include "kiln/data/gpu_decode/nvjpeg_library.h"

#include <dlfcn.h>
#include <glob.h>
#include <link.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <type_traits>

#include "kiln/tensor/env_vars.h"
#include "kiln/tensor/error.h"

#ifndef KILN_WITH_NVJPEG
#define KILN_WITH_NVJPEG 0
#endif
#if KILN_WITH_NVJPEG
#include "kiln/data/gpu_decode/nvjpeg_functions.h"
#endif

namespace kiln::data::nvjpeg {

namespace {

constexpr const char* kSoname = "libnvjpeg.so.13";
constexpr const char* kHowToGet =
    "run scripts/setup.sh (it installs PyPI's nvidia-nvjpeg into third_party/nvjpeg), or pip install "
    "nvidia-nvjpeg, or point KILN_NVJPEG_LIBRARY at a libnvjpeg.so.13; or decode on the CPU "
    "(ImageFolderOptions::decode = Decode::Cpu)";

std::vector<std::string> glob_paths(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  return out;
}

}  // namespace

bool built_with_header() { return KILN_WITH_NVJPEG != 0; }

std::vector<std::string> candidate_paths() {
  if (const char* env = std::getenv("KILN_NVJPEG_LIBRARY"); env && *env) return {env};
  std::vector<std::string> paths = {kSoname};
#ifdef KILN_NVJPEG_THIRD_PARTY_LIB
  paths.emplace_back(KILN_NVJPEG_THIRD_PARTY_LIB);
#endif
  // third_party/nvjpeg/lib above the running program (a build tree inside the repository, carried elsewhere).
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  for (int up = 0; !ec && up < 5 && !dir.empty(); ++up, dir = dir.parent_path()) {
    const auto p = dir / "third_party" / "nvjpeg" / "lib" / kSoname;
    if (std::filesystem::exists(p, ec)) paths.push_back(p.string());
    if (dir == dir.parent_path()) break;
  }
  std::vector<std::string> roots = {"/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages",
                                    "/opt/conda/lib/python3*/site-packages"};
  if (const char* home = std::getenv("HOME")) roots.push_back(std::string(home) + "/.local/lib/python3*/site-packages");
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
    if (const char* v = std::getenv(var); v && *v) roots.push_back(std::string(v) + "/lib/python3*/site-packages");
  }
  for (const auto& root : roots) {
    for (const char* sub : {"/nvidia/cu13/lib/", "/nvidia/nvjpeg/lib/"}) {
      for (auto& p : glob_paths(root + sub + kSoname)) paths.push_back(std::move(p));
    }
  }
  return paths;
}

#if KILN_WITH_NVJPEG

std::string status_text(nvjpegStatus_t s) {
  switch (s) {
    case NVJPEG_STATUS_SUCCESS: return "NVJPEG_STATUS_SUCCESS";
    case NVJPEG_STATUS_NOT_INITIALIZED: return "NVJPEG_STATUS_NOT_INITIALIZED";
    case NVJPEG_STATUS_INVALID_PARAMETER: return "NVJPEG_STATUS_INVALID_PARAMETER";
    case NVJPEG_STATUS_BAD_JPEG: return "NVJPEG_STATUS_BAD_JPEG (not a valid JPEG stream)";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED: return "NVJPEG_STATUS_JPEG_NOT_SUPPORTED (a JPEG kind nvJPEG lacks)";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE: return "NVJPEG_STATUS_ALLOCATOR_FAILURE (out of memory?)";
    case NVJPEG_STATUS_EXECUTION_FAILED: return "NVJPEG_STATUS_EXECUTION_FAILED";
    case NVJPEG_STATUS_ARCH_MISMATCH: return "NVJPEG_STATUS_ARCH_MISMATCH (this GPU is not supported)";
    case NVJPEG_STATUS_INTERNAL_ERROR: return "NVJPEG_STATUS_INTERNAL_ERROR";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: return "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM: return "NVJPEG_STATUS_INCOMPLETE_BITSTREAM (a truncated file)";
  }
  return "nvJPEG status " + std::to_string(static_cast<int>(s));
}

LoadResult load(const std::vector<std::string>& paths) {
  LoadResult r;
  std::string tried;
  for (const auto& path : paths) {
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      tried += "\n  " + path + ": " + (why ? why : "dlopen failed");
      continue;
    }
    auto* f = new Functions;
    std::string missing;
    auto need = [&](const char* name, auto* slot) {
      *slot = reinterpret_cast<std::remove_pointer_t<decltype(slot)>>(dlsym(lib, name));
      if (!*slot) missing += std::string(missing.empty() ? "" : ", ") + name;
    };
    need("nvjpegGetProperty", &f->get_property);
    need("nvjpegCreateEx", &f->create_ex);
    need("nvjpegDestroy", &f->destroy);
    need("nvjpegJpegStateCreate", &f->state_create);
    need("nvjpegJpegStateDestroy", &f->state_destroy);
    need("nvjpegGetImageInfo", &f->get_image_info);
    need("nvjpegDecode", &f->decode);
    need("nvjpegDecodeBatchedInitialize", &f->batched_initialize);
    need("nvjpegDecodeBatched", &f->decode_batched);
    need("nvjpegJpegStreamCreate", &f->stream_create);
    need("nvjpegJpegStreamDestroy", &f->stream_destroy);
    need("nvjpegJpegStreamParse", &f->stream_parse);
    need("nvjpegDecodeBatchedSupported", &f->batched_supported);
    need("nvjpegJpegStreamGetComponentsNum", &f->stream_components);
    need("nvjpegJpegStreamGetComponentDimensions", &f->stream_component_size);
    need("nvjpegJpegStreamGetChromaSubsampling", &f->stream_subsampling);
    need("nvjpegSetDeviceMemoryPadding", &f->set_device_padding);
    need("nvjpegSetPinnedMemoryPadding", &f->set_pinned_padding);
    if (!missing.empty()) {
      tried += "\n  " + path + ": lacks " + missing + " (not nvJPEG 13, or too old)";
      delete f;
      dlclose(lib);
      continue;
    }
    r.functions = f;  // kept for the process's life, as the library
    link_map* map = nullptr;
    r.path = (dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name) ? map->l_name : path;
    return r;
  }
  r.error = "GPU JPEG decoding needs nvJPEG (" + std::string(kSoname) + "), which was not found; tried:" + tried +
            "\nTo get it: " + kHowToGet;
  return r;
}

#else  // built without nvjpeg.h

LoadResult load(const std::vector<std::string>&) {
  LoadResult r;
#ifdef KILN_WITH_CUDA
  const char* lacking = "nvjpeg.h";
#else
  const char* lacking = "CUDA";
#endif
  r.error = std::string("GPU JPEG decoding is not in this build of kiln: it was built without ") + lacking +
            ". Rebuild after scripts/setup.sh has installed nvjpeg.h into third_party/nvjpeg (PyPI's "
            "nvidia-nvjpeg), with CUDA; or decode on the CPU (ImageFolderOptions::decode = Decode::Cpu)";
  return r;
}

#endif

namespace {
struct Process {
  std::once_flag once;
  LoadResult result;
};
Process& process() {
  static Process p;
  return p;
}
}  // namespace

const Functions& functions() {
  Process& p = process();
  std::call_once(p.once, [&] { p.result = load(candidate_paths()); });
  KILN_CHECK(p.result.functions != nullptr, p.result.error);
  return *p.result.functions;
}

std::string library_path() {
  Process& p = process();
  return p.result.functions ? p.result.path : std::string();
}

bool hardware_engines_wanted() { return env_flag("KILN_NVJPEG_HARDWARE", false); }

}  // namespace kiln::data::nvjpeg
