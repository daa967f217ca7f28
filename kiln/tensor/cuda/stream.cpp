// Streams, events and the per-thread current stream.
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/cuda/cuda_backend.h"

namespace kiln::cuda {}  // namespace kiln::cuda
