# Helpers the module folders use while declaring their targets.

# kiln_package_dependency([PUBLIC] <find_package arguments>)
#
# Records a package that kiln's exported targets refer to, so the generated kilnConfig.cmake calls
# find_dependency(<arguments>) before it loads the targets. Needed for every external target that
# appears in kiln's link interface: PUBLIC dependencies, and PRIVATE ones of the modules when kiln is
# the static libkiln.a (CMake exports those as $<LINK_ONLY:...> because a program's link still needs
# them). With KILN_SHARED (one libkiln.so) private dependencies are linked into the library and never
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

# Module libraries (kiln_tensor, kiln_autograd, ...) are OBJECT libraries, in shared and static builds
# alike: their objects make up the one library kiln (libkiln.so, or libkiln.a with KILN_SHARED off), and
# kiln/CMakeLists.txt refuses a module of any other type. Module folders write add_library(kiln_<module>
# OBJECT <sources>) (or INTERFACE while they have no sources) and then kiln_module_alias(kiln_<module>
# <module>).
#
# kiln_module_alias(<target> <module>)
#
# Names what users link for one module: kiln::<module>. Every module lives in the one library kiln, so
# kiln::<module> is another name of kiln::kiln: kiln/CMakeLists.txt makes these aliases once the library
# exists, and the installed kilnConfig.cmake defines the same names. (A module is not a library of its own:
# Tensor's methods, declared in kiln/tensor, are defined in kiln/autograd.)
function(kiln_module_alias target module)
  set_property(GLOBAL APPEND PROPERTY KILN_MODULE_NAMES ${module})
endfunction()

# kiln_add_module(<module> DEPENDS <target>... [GLOBS <pattern>...])
#
# The usual module folder in one call: the object library kiln_<module> of the calling folder's *.cpp (and of the
# files that GLOBS, relative to the folder, match), named kiln::<module> (kiln_module_alias), linked PUBLIC to the
# modules it DEPENDS on, and compiled with kiln's warnings.
function(kiln_add_module module)
  cmake_parse_arguments(PARSE_ARGV 1 _arg "" "" "DEPENDS;GLOBS")
  set(_patterns ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp)
  foreach(_glob IN LISTS _arg_GLOBS)
    list(APPEND _patterns ${CMAKE_CURRENT_SOURCE_DIR}/${_glob})
  endforeach()
  file(GLOB _sources CONFIGURE_DEPENDS ${_patterns})
  add_library(kiln_${module} OBJECT ${_sources})
  kiln_module_alias(kiln_${module} ${module})
  target_link_libraries(kiln_${module} PUBLIC ${_arg_DEPENDS})
  kiln_use_privately(kiln_${module} kiln_warnings)
endfunction()

# kiln_use_privately(<target> <interface target>...)
#
# Gives <target> the compile-time usage requirements (include folders, definitions, options) of
# header-only or flag-only INTERFACE targets such as Eigen3::Eigen or kiln_warnings, without adding
# them to its link interface. target_link_libraries(... PRIVATE) would put them there (an object
# library's private links are kiln's, kiln/CMakeLists.txt), and a static libkiln.a would then require
# every user to find Eigen. (CMake 3.26's $<BUILD_LOCAL_INTERFACE:...> does the same; kiln supports 3.24.)
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
# for the static libkiln.a kilnConfig.cmake finds the HDF5 C library itself (kiln::hdf5_c, by name) — not
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

# kiln_add_cuda_sources(<target>)
#
# A module's GPU implementations: compiles the calling folder's cuda/*.cpp and cuda/*.cu into <target>, defines
# KILN_WITH_CUDA=1 for its sources (the code that calls them for CUDA tensors), links the CUDA runtime privately
# and gives nvcc kiln's options. Call it under if(KILN_CUDA).
function(kiln_add_cuda_sources target)
  file(GLOB _sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/cuda/*.cpp ${CMAKE_CURRENT_SOURCE_DIR}/cuda/*.cu)
  target_sources(${target} PRIVATE ${_sources})
  target_compile_definitions(${target} PRIVATE KILN_WITH_CUDA=1)
  target_link_libraries(${target} PRIVATE ${KILN_CUDART})
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr --extended-lambda -Xcompiler=-Wall>)
endfunction()
