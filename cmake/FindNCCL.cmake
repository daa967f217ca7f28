# FindNCCL.cmake — finds NVIDIA NCCL (headers and library).
#
#   find_package(NCCL 2.18 REQUIRED)
#   target_link_libraries(my_target PRIVATE NCCL::nccl)
#
# Where it looks, first to last:
#   NCCL_ROOT (CMake or environment variable), NCCL_HOME / NCCL_DIR (environment), the CUDA toolkit
#   found by find_package(CUDAToolkit), CUDA_PATH / CUDA_HOME (environment), /usr/local/cuda, then the
#   system paths, including the Debian/Ubuntu multiarch folders (/usr/include/x86_64-linux-gnu,
#   /usr/lib/x86_64-linux-gnu) that NVIDIA's libnccl-dev package uses.
#
# Set NCCL_USE_STATIC=ON to link libnccl_static.a instead of libnccl.so.
#
# Result variables:
#   NCCL_FOUND, NCCL_VERSION (e.g. "2.28.3"), NCCL_VERSION_MAJOR/MINOR/PATCH,
#   NCCL_INCLUDE_DIRS, NCCL_LIBRARIES
# Cache variables (set them to skip the search): NCCL_INCLUDE_DIR, NCCL_LIBRARY
# Imported target: NCCL::nccl

include(FindPackageHandleStandardArgs)

option(NCCL_USE_STATIC "Link NCCL statically (libnccl_static.a)" OFF)

set(_nccl_toolkit_hints)
foreach(_dir IN ITEMS "${CUDAToolkit_LIBRARY_ROOT}" "${CUDAToolkit_TARGET_DIR}" "${CUDAToolkit_ROOT}"
                      "$ENV{CUDAToolkit_ROOT}" "$ENV{CUDA_PATH}" "$ENV{CUDA_HOME}" "/usr/local/cuda")
  if(_dir)
    list(APPEND _nccl_toolkit_hints "${_dir}")
  endif()
endforeach()
if(CUDAToolkit_BIN_DIR)
  get_filename_component(_dir "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  list(APPEND _nccl_toolkit_hints "${_dir}")
endif()

set(_nccl_hints "${NCCL_ROOT}" "$ENV{NCCL_ROOT}" "$ENV{NCCL_HOME}" "$ENV{NCCL_DIR}")

if(NCCL_USE_STATIC)
  set(_nccl_names nccl_static)
else()
  set(_nccl_names nccl)
endif()

find_path(NCCL_INCLUDE_DIR
  NAMES nccl.h
  HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS} ${_nccl_toolkit_hints}
  PATH_SUFFIXES include include/x86_64-linux-gnu targets/x86_64-linux/include
  PATHS /usr/include/x86_64-linux-gnu /usr/include
  DOC "Folder holding nccl.h")

find_library(NCCL_LIBRARY
  NAMES ${_nccl_names}
  HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR} ${_nccl_toolkit_hints}
  PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu targets/x86_64-linux/lib
  PATHS /usr/lib/x86_64-linux-gnu
  DOC "The NCCL library (libnccl or libnccl_static)")

# The version, from the NCCL_MAJOR/MINOR/PATCH defines of nccl.h.
unset(NCCL_VERSION)
if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_defines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  if(_nccl_defines)
    string(REGEX REPLACE ".*#define NCCL_MAJOR +([0-9]+).*" "\\1" NCCL_VERSION_MAJOR "${_nccl_defines}")
    string(REGEX REPLACE ".*#define NCCL_MINOR +([0-9]+).*" "\\1" NCCL_VERSION_MINOR "${_nccl_defines}")
    string(REGEX REPLACE ".*#define NCCL_PATCH +([0-9]+).*" "\\1" NCCL_VERSION_PATCH "${_nccl_defines}")
    set(NCCL_VERSION "${NCCL_VERSION_MAJOR}.${NCCL_VERSION_MINOR}.${NCCL_VERSION_PATCH}")
  endif()
endif()

find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION
  REASON_FAILURE_MESSAGE "set NCCL_ROOT to the folder holding include/nccl.h and lib/libnccl.so")

if(NCCL_FOUND)
  set(NCCL_INCLUDE_DIRS "${NCCL_INCLUDE_DIR}")
  set(NCCL_LIBRARIES "${NCCL_LIBRARY}")
  if(NOT TARGET NCCL::nccl)
    add_library(NCCL::nccl UNKNOWN IMPORTED)
    set_target_properties(NCCL::nccl PROPERTIES
      IMPORTED_LOCATION "${NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
    if(NCCL_USE_STATIC)
      # The static archive needs the CUDA runtime and the threading/dl/rt libraries it was built against.
      set(_nccl_static_deps Threads::Threads ${CMAKE_DL_LIBS} rt)
      if(TARGET CUDA::cudart_static)
        list(PREPEND _nccl_static_deps CUDA::cudart_static)
      endif()
      if(NOT TARGET Threads::Threads)
        find_package(Threads REQUIRED)
      endif()
      set_property(TARGET NCCL::nccl PROPERTY INTERFACE_LINK_LIBRARIES "${_nccl_static_deps}")
    endif()
  endif()
endif()

mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
unset(_nccl_hints)
unset(_nccl_toolkit_hints)
unset(_nccl_names)
unset(_nccl_defines)
unset(_nccl_static_deps)
unset(_dir)
