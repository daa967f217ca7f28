// A stand-in libnccl.so.2 without ncclGetVersion: kiln-doctor must say the file is not a usable NCCL.
extern "C" int ncclCommCount(void*, int* count) {
  *count = 0;
  return 0;
}
