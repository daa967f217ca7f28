# FindCUDNN.cmake — finds NVIDIA cuDNN (headers and the main library).
#
#   find_package(CUDNN 9 REQUIRED)
#   target_link_libraries(my_target PRIVATE CUDNN::cudnn)
#
# Where it looks, first to last:
#   CUDNN_ROOT (CMake or environment variable; CMake >= 3.12 also honours it through find_package),
#   CUDNN_HOME / CUDNN_PATH (environment), the CUDA toolkit found by find_package(CUDAToolkit)
#   (cuDNN is often unpacked into it, e.g. /usr/local/cuda/include/cudnn.h), CUDA_PATH / CUDA_HOME
#   (environment), /usr/local/cuda, then the system paths, including the Debian/Ubuntu multiarch
#   folders the NVIDIA packages use (/usr/include/x86_64-linux-gnu, /usr/lib/x86_64-linux-gnu).
#
# Result variables:
#   CUDNN_FOUND, CUDNN_VERSION (e.g. "9.14.0"), CUDNN_VERSION_MAJOR/MINOR/PATCH,
#   CUDNN_INCLUDE_DIRS, CUDNN_LIBRARIES
# Cache variables (set them to skip the search): CUDNN_INCLUDE_DIR, CUDNN_LIBRARY
# Imported target: CUDNN::cudnn
#
# cuDNN 9 splits into sub-libraries (cudnn_graph, cudnn_ops, cudnn_cnn, ...) that libcudnn loads on
# demand, so linking libcudnn alone is enough.

include(FindPackageHandleStandardArgs)

# The CUDA toolkit's own variables, when the caller ran find_package(CUDAToolkit) first.
set(_cudnn_toolkit_hints)
foreach(_dir IN ITEMS "${CUDAToolkit_LIBRARY_ROOT}" "${CUDAToolkit_TARGET_DIR}" "${CUDAToolkit_ROOT}"
                      "$ENV{CUDAToolkit_ROOT}" "$ENV{CUDA_PATH}" "$ENV{CUDA_HOME}" "/usr/local/cuda")
  if(_dir)
    list(APPEND _cudnn_toolkit_hints "${_dir}")
  endif()
endforeach()
if(CUDAToolkit_BIN_DIR)
  get_filename_component(_dir "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  list(APPEND _cudnn_toolkit_hints "${_dir}")
endif()

set(_cudnn_hints "${CUDNN_ROOT}" "$ENV{CUDNN_ROOT}" "$ENV{CUDNN_HOME}" "$ENV{CUDNN_PATH}")

find_path(CUDNN_INCLUDE_DIR
  NAMES cudnn_version.h cudnn.h
  HINTS ${_cudnn_hints} ${CUDAToolkit_INCLUDE_DIRS} ${_cudnn_toolkit_hints}
  PATH_SUFFIXES include include/x86_64-linux-gnu targets/x86_64-linux/include
  PATHS /usr/include/x86_64-linux-gnu /usr/include
  DOC "Folder holding cudnn.h")

find_library(CUDNN_LIBRARY
  NAMES cudnn
  HINTS ${_cudnn_hints} ${CUDAToolkit_LIBRARY_DIR} ${_cudnn_toolkit_hints}
  PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu targets/x86_64-linux/lib lib/x64
  PATHS /usr/lib/x86_64-linux-gnu
  DOC "The cuDNN library (libcudnn)")

# The version: cuDNN >= 8 keeps it in cudnn_version.h, older releases in cudnn.h.
unset(CUDNN_VERSION)
if(CUDNN_INCLUDE_DIR)
  foreach(_header IN ITEMS cudnn_version.h cudnn.h)
    if(EXISTS "${CUDNN_INCLUDE_DIR}/${_header}")
      file(STRINGS "${CUDNN_INCLUDE_DIR}/${_header}" _cudnn_defines
           REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
      if(_cudnn_defines)
        string(REGEX REPLACE ".*#define CUDNN_MAJOR +([0-9]+).*" "\\1" CUDNN_VERSION_MAJOR "${_cudnn_defines}")
        string(REGEX REPLACE ".*#define CUDNN_MINOR +([0-9]+).*" "\\1" CUDNN_VERSION_MINOR "${_cudnn_defines}")
        string(REGEX REPLACE ".*#define CUDNN_PATCHLEVEL +([0-9]+).*" "\\1" CUDNN_VERSION_PATCH "${_cudnn_defines}")
        set(CUDNN_VERSION "${CUDNN_VERSION_MAJOR}.${CUDNN_VERSION_MINOR}.${CUDNN_VERSION_PATCH}")
        break()
      endif()
    endif()
  endforeach()
endif()

find_package_handle_standard_args(CUDNN
  REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR
  VERSION_VAR CUDNN_VERSION
  REASON_FAILURE_MESSAGE "set CUDNN_ROOT to the folder holding include/cudnn.h and lib/libcudnn.so")

if(CUDNN_FOUND)
  set(CUDNN_INCLUDE_DIRS "${CUDNN_INCLUDE_DIR}")
  set(CUDNN_LIBRARIES "${CUDNN_LIBRARY}")
  if(NOT TARGET CUDNN::cudnn)
    add_library(CUDNN::cudnn UNKNOWN IMPORTED)
    set_target_properties(CUDNN::cudnn PROPERTIES
      IMPORTED_LOCATION "${CUDNN_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
  endif()
endif()

mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
unset(_cudnn_hints)
unset(_cudnn_toolkit_hints)
unset(_cudnn_defines)
unset(_header)
unset(_dir)
