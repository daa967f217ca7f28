// How this kiln was built: the CMake settings (compile definitions set by tools/doctor/CMakeLists.txt) and,
// in a CUDA build, the versions in the headers kiln compiled against. Headers only: nothing is linked.
#include "gather.h"
#include "kiln/monitor/nvml/nvml_library.h"
#include "kiln/version.h"

#if KILN_DOCTOR_CUDA
#include <cublas_api.h>        // CUBLAS_VERSION
#include <cuda_runtime_api.h>  // CUDART_VERSION
#include <cudnn_version.h>     // CUDNN_VERSION
#include <nccl.h>              // NCCL_VERSION_CODE
#endif

namespace kiln::doctor {

BuildFacts build_facts() {
  BuildFacts b;
  b.kiln_version = KILN_VERSION_STRING;
  b.compiler = KILN_DOCTOR_COMPILER;
  b.build_type = KILN_DOCTOR_BUILD_TYPE;
  b.cuda = KILN_DOCTOR_CUDA != 0;
  b.mpi = KILN_DOCTOR_MPI != 0;
  b.cuda_architectures = KILN_DOCTOR_CUDA_ARCHITECTURES;
#if KILN_DOCTOR_CUDA
  b.cudart_version = CUDART_VERSION;
  b.cublas_version = CUBLAS_VERSION;
  b.cudnn_version = CUDNN_VERSION;
  b.nccl_version = NCCL_VERSION_CODE;
#endif
  b.hdf5_version = KILN_DOCTOR_HDF5_VERSION;
  b.eigen_version = KILN_DOCTOR_EIGEN_VERSION;
  b.mpi_library = KILN_DOCTOR_MPI_LIBRARY;
  b.hdf5_library = KILN_DOCTOR_HDF5_LIBRARY;
  b.nvml_header = monitor::nvml::built_with_header();
  return b;
}

}  // namespace kiln::doctor
