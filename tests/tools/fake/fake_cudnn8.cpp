// A stand-in libcudnn.so.9 that reports cuDNN 8.9.7: kiln-doctor must call it the wrong version.
#include <cstddef>

extern "C" size_t cudnnGetVersion() { return 8907; }
