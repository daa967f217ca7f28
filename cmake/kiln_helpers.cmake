# Helpers the module folders use while declaring their targets.

# kiln_package_dependency(<find_package arguments>)
#
# Records a package that kiln's exported targets refer to, so the generated kilnConfig.cmake calls
# find_dependency(<arguments>) before it loads the targets. Needed for every external target that
# appears in a kiln library's link interface: PUBLIC dependencies, and PRIVATE ones of static
# libraries (CMake exports those as $<LINK_ONLY:...> because the final link still needs them).
# Header-only private dependencies (Eigen) need none: link them as $<BUILD_INTERFACE:...> instead.
# The install test (tests/install/) fails when an entry is missing.
function(kiln_package_dependency)
  list(JOIN ARGN " " _args)
  get_property(_deps GLOBAL PROPERTY KILN_PACKAGE_DEPENDENCIES)
  if(NOT _args IN_LIST _deps)
    set_property(GLOBAL APPEND PROPERTY KILN_PACKAGE_DEPENDENCIES "${_args}")
  endif()
endfunction()

# kiln_use_privately(<target> <interface target>...)
#
# Gives <target> the compile-time usage requirements (include folders, definitions, options) of
# header-only or flag-only INTERFACE targets such as Eigen3::Eigen or kiln_warnings, without adding
# them to its link interface. target_link_libraries(... PRIVATE) would put them there as
# $<LINK_ONLY:...> for a static library, and the exported targets would then require every user
# to find Eigen. (CMake 3.26's $<BUILD_LOCAL_INTERFACE:...> does the same; kiln supports 3.24.)
function(kiln_use_privately target)
  foreach(dep IN LISTS ARGN)
    if(NOT TARGET ${dep})
      message(FATAL_ERROR "kiln_use_privately(${target}): ${dep} is not a target")
    endif()
    target_include_directories(${target} SYSTEM PRIVATE $<TARGET_PROPERTY:${dep},INTERFACE_INCLUDE_DIRECTORIES>)
    target_compile_definitions(${target} PRIVATE $<TARGET_PROPERTY:${dep},INTERFACE_COMPILE_DEFINITIONS>)
    target_compile_options(${target} PRIVATE $<TARGET_PROPERTY:${dep},INTERFACE_COMPILE_OPTIONS>)
  endforeach()
endfunction()

# kiln_link_hdf5(<target>)
#
# Links the HDF5 C library privately by its file paths (HDF5_C_LIBRARIES) and takes HDF5::HDF5's include
# folders and definitions for compiling only. Exported targets then name the library files instead of
# HDF5::HDF5, so a project that uses kiln needs no find_package(HDF5) — which, with COMPONENTS C, fails in a
# C++-only project (FindHDF5 test-compiles a C file).
function(kiln_link_hdf5 target)
  kiln_use_privately(${target} HDF5::HDF5)
  target_link_libraries(${target} PRIVATE ${HDF5_C_LIBRARIES})
endfunction()

# kiln_find_nvidia_header(VAR HEADER FOLDER ENV_VAR DOC): the folder holding HEADER, looked for first in
# third_party/FOLDER/include (where scripts/setup.sh installs NVIDIA's header packages from PyPI) and in the folder
# the environment variable ENV_VAR names, then in the CUDA toolkit's include folder (some toolkits ship the header).
# VAR is a cache variable, as find_path's: VAR-NOTFOUND when neither has it.
function(kiln_find_nvidia_header var header folder env doc)
  find_path(${var} ${header} HINTS ${PROJECT_SOURCE_DIR}/third_party/${folder}/include ENV ${env} NO_DEFAULT_PATH
            DOC "${doc}")
  if(NOT ${var})
    find_path(${var} ${header} HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include DOC "${doc}")
  endif()
endfunction()
