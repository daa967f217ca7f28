// A stand-in libcuda.so.1 with one GPU, for running kiln-doctor through driver failures on any machine:
//   FAKE_CUDA_DRIVER_VERSION  what cuDriverGetVersion answers (default 13000, CUDA 13.0)
//   FAKE_CUDA_CC              the GPU's compute capability as major * 10 + minor (default 90)
//   CUDA_VISIBLE_DEVICES      anything but "0" hides the GPU (cuInit answers CUDA_ERROR_NO_DEVICE), as the
//                             real driver does for indices that do not exist
// Only the driver-API calls kiln-doctor makes are here: the CUDA runtime inside kiln finds nothing it can
// use in it, which is itself a failure the doctor must report.
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}
constexpr int kNoDevice = 100;
}  // namespace

extern "C" {
int cuDriverGetVersion(int* v) {
  *v = env_int("FAKE_CUDA_DRIVER_VERSION", 13000);
  return 0;
}
int cuInit(unsigned) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return visible && std::strcmp(visible, "0") != 0 ? kNoDevice : 0;
}
int cuDeviceGetCount(int* n) {
  *n = 1;
  return 0;
}
int cuDeviceGet(int* device, int ordinal) {
  *device = ordinal;
  return ordinal == 0 ? 0 : 101;  // CUDA_ERROR_INVALID_DEVICE
}
int cuDeviceGetName(char* name, int length, int) {
  std::snprintf(name, static_cast<size_t>(length), "Fake GPU");
  return 0;
}
int cuDeviceGetAttribute(int* value, int attribute, int) {
  const int cc = env_int("FAKE_CUDA_CC", 90);
  switch (attribute) {
    case 75: *value = cc / 10; break;  // compute capability major
    case 76: *value = cc % 10; break;  // minor
    case 16: *value = 132; break;      // multiprocessors
    case 13: *value = 1980000; break;  // clock, kHz
    case 36: *value = 2619000; break;  // memory clock, kHz
    case 37: *value = 6144; break;     // memory bus, bits
    default: *value = 0;
  }
  return 0;
}
int cuDeviceTotalMem_v2(size_t* bytes, int) {
  *bytes = size_t{150} << 30;
  return 0;
}
int cuDeviceGetPCIBusId(char* id, int length, int) {
  std::snprintf(id, static_cast<size_t>(length), "0000:3B:00.0");
  return 0;
}
int cuGetErrorName(int r, const char** s) {
  *s = r == kNoDevice ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN";
  return 0;
}
int cuGetErrorString(int r, const char** s) {
  *s = r == kNoDevice ? "no CUDA-capable device is detected" : "unknown error";
  return 0;
}
}
