# Helpers the module folders use while declaring their targets.

# kiln_package_dependency([PUBLIC] <find_package arguments>)
#
# Records a package that kiln's exported targets refer to, so the generated kilnConfig.cmake calls
# find_dependency(<arguments>) before it loads the targets. Needed for every external target that
# appears in a kiln library's link interface: PUBLIC dependencies, and PRIVATE ones of static
# libraries (CMake exports those as $<LINK_ONLY:...> because the final link still needs them).
# With KILN_SHARED (one libkiln.so) private dependencies are linked into the library and never
# exported, so only the packages marked PUBLIC are recorded: a user's project then needs none of
# the CUDA, cuDNN, NCCL, MPI, HDF5 or image development packages.
# Header-only private dependencies (Eigen) need none: link them as $<BUILD_INTERFACE:...> instead.
# The install test (tests/install/) fails when an entry is missing.
function(kiln_package_dependency)
  set(_args ${ARGN})
  set(_public FALSE)
  if(_args AND ARGV0 STREQUAL "PUBLIC")
    set(_public TRUE)
    list(REMOVE_AT _args 0)
  endif()
  if(KILN_SHARED AND NOT _public)
    return()
  endif()
  list(JOIN _args " " _args)
  get_property(_deps GLOBAL PROPERTY KILN_PACKAGE_DEPENDENCIES)
  if(NOT _args IN_LIST _deps)
    set_property(GLOBAL APPEND PROPERTY KILN_PACKAGE_DEPENDENCIES "${_args}")
  endif()
endfunction()

# ${KILN_MODULE_LIBRARY_TYPE}: the type of each module's library (kiln_tensor, kiln_autograd, ...):
# OBJECT with KILN_SHARED, whose objects make up the one shared library kiln (libkiln.so); STATIC
# otherwise, one archive per module. Module folders write add_library(kiln_<module>
# ${KILN_MODULE_LIBRARY_TYPE} <sources>) and then kiln_module_alias(kiln_<module> <module>).
if(KILN_SHARED)
  set(KILN_MODULE_LIBRARY_TYPE OBJECT)
else()
  set(KILN_MODULE_LIBRARY_TYPE STATIC)
endif()

# kiln_module_alias(<target> <module>)
#
# Names what users link for one module: kiln::<module>. For static libraries that is the module's own
# library (exported as kiln::<module>); with KILN_SHARED every module lives in libkiln.so, so
# kiln::<module> becomes another name of kiln::kiln (kiln/CMakeLists.txt makes these aliases once
# the library exists; the installed kilnConfig.cmake defines the same names).
function(kiln_module_alias target module)
  if(KILN_SHARED)
    set_property(GLOBAL APPEND PROPERTY KILN_MODULE_NAMES ${module})
  else()
    add_library(kiln::${module} ALIAS ${target})
    set_target_properties(${target} PROPERTIES EXPORT_NAME ${module})
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
# Links the HDF5 C library privately through kiln_hdf5 and takes HDF5::HDF5's include folders and
# definitions for compiling only. In the build tree kiln_hdf5 is HDF5_C_LIBRARIES (file paths); the
# installed package names no file of the build machine: with KILN_SHARED it is not exported at all, and
# for static libraries kilnConfig.cmake finds the HDF5 C library itself (kiln::hdf5_c, by name) — not
# with find_package(HDF5 COMPONENTS C), which fails in a C++-only project (FindHDF5 test-compiles a C
# file).
function(kiln_link_hdf5 target)
  kiln_use_privately(${target} HDF5::HDF5)
  target_link_libraries(${target} PRIVATE kiln_hdf5)
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
