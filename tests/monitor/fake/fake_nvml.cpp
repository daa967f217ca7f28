// Stand-ins for libnvidia-ml.so.1 (NVML's C interface by hand: no nvml.h needed to build them).
//   FAKE_NVML_OLD        an old driver: the device-lookup and sampling functions kiln needs are missing
//   FAKE_NVML_NO_DRIVER  every function there, but nvmlInit answers NVML_ERROR_DRIVER_NOT_LOADED (9)
//   FAKE_NVML_TWO_GPUS   a working NVML that counts two GPUs and finds neither (kiln-doctor's tests: the GPUs
//                        CUDA_VISIBLE_DEVICES hides)
extern "C" {
int nvmlInit_v2() {
#if FAKE_NVML_NO_DRIVER
  return 9;
#else
  return 0;
#endif
}
int nvmlShutdown() { return 0; }
const char* nvmlErrorString(int r) { return r == 9 ? "Driver Not Loaded" : "Unknown Error"; }
int nvmlSystemGetDriverVersion(char* v, unsigned n) {
  if (n > 0) v[0] = '\0';
  return 0;
}
int nvmlDeviceGetCount_v2(unsigned* n) {
#if FAKE_NVML_TWO_GPUS
  *n = 2;
#else
  *n = 0;
#endif
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned, void**) { return 2; }
#if FAKE_NVML_NO_DRIVER || FAKE_NVML_TWO_GPUS
int nvmlDeviceGetHandleByPciBusId_v2(const char*, void**) { return 2; }
int nvmlDeviceGetMemoryInfo(void*, void*) { return 2; }
int nvmlDeviceGetUtilizationRates(void*, void*) { return 2; }
#endif
}
