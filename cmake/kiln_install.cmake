# Install rules and the CMake package (kilnConfig.cmake) for find_package(kiln), from an install
# prefix and from the build tree. Included by the top-level CMakeLists.txt after the targets exist.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(KILN_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/kiln" CACHE STRING
    "Where kilnConfig.cmake is installed, relative to the prefix")
mark_as_advanced(KILN_INSTALL_CMAKEDIR)

# ---- the library: libkiln.so (KILN_SHARED), or libkiln.a with the kiln helpers its link interface names ----
# (kiln::nvml, kiln::hdf5, kiln::onnx_proto). The modules are not libraries of their own: kiln::<module> is kiln::kiln.
install(TARGETS ${KILN_LIBRARY_TARGETS} EXPORT kilnTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# ---- libraries from third_party/ (a machine without the system package): installed into the prefix ----
# libkiln.so needs ISA-L's libisal.so.2 and protobuf's libprotobuf.so.32 (KILN_ONNX) at run time and at a program's
# link. The system's copies are found by every linker; a copy scripts/setup.sh put into the source tree is not, so the
# prefix carries it and libkiln.so finds it through its $ORIGIN run path. A static libkiln.a leaves them to the
# program's link: kilnConfig.cmake finds them (FindISAL looks in the prefix it was installed into too; FindProtobuf in
# CMAKE_PREFIX_PATH), so the prefix carries their headers as well.
# kiln_install_third_party(<library file> <file name glob> <header file or folder>...)
function(kiln_install_third_party library glob)
  if(NOT library OR NOT library MATCHES "^${PROJECT_SOURCE_DIR}/third_party/")
    return()  # the system's
  endif()
  get_filename_component(_dir "${library}" DIRECTORY)
  file(GLOB _files "${_dir}/${glob}")
  install(FILES ${_files} DESTINATION ${CMAKE_INSTALL_LIBDIR})
  if(TARGET kiln AND KILN_SHARED)
    get_target_property(_rpath kiln INSTALL_RPATH)
    if(NOT "$ORIGIN" IN_LIST _rpath)
      set_property(TARGET kiln APPEND PROPERTY INSTALL_RPATH "$ORIGIN")
    endif()
  endif()
  if(NOT KILN_SHARED)
    foreach(_header IN LISTS ARGN)
      if(IS_DIRECTORY "${_header}")
        install(DIRECTORY "${_header}" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
      else()
        install(FILES "${_header}" DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
      endif()
    endforeach()
  endif()
endfunction()
kiln_install_third_party("${ISAL_LIBRARY}" "libisal.so*" ${ISAL_INCLUDE_DIR}/isa-l.h ${ISAL_INCLUDE_DIR}/isa-l)
if(KILN_ONNX)
  kiln_install_third_party("${Protobuf_LIBRARY_RELEASE}" "libprotobuf.so*" ${Protobuf_INCLUDE_DIR}/google)
endif()

# ---- headers: kiln/**/*.h with their paths, except the backends' internals ----
# Public headers include only kiln/<module>/*.h; KILN_PRIVATE_HEADER_DIRS (CMakeLists.txt) are the backends' internals.
file(GLOB_RECURSE _kiln_headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/kiln/*.h)
foreach(_header IN LISTS _kiln_headers)
  get_filename_component(_dir ${_header} DIRECTORY)
  set(_private FALSE)
  foreach(_private_dir IN LISTS KILN_PRIVATE_HEADER_DIRS)
    if(_dir STREQUAL _private_dir OR _dir MATCHES "^${_private_dir}/")
      set(_private TRUE)
    endif()
  endforeach()
  if(NOT _private)
    install(FILES ${PROJECT_SOURCE_DIR}/${_header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${_dir})
  endif()
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/include/kiln/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln)

# ---- package configuration ----
set(KILN_FIND_DEPENDENCIES "")
get_property(_kiln_deps GLOBAL PROPERTY KILN_PACKAGE_DEPENDENCIES)
foreach(_dep IN LISTS _kiln_deps)
  string(APPEND KILN_FIND_DEPENDENCIES "find_dependency(${_dep})\n")
endforeach()

get_property(_kiln_module_names GLOBAL PROPERTY KILN_MODULE_NAMES)
list(JOIN _kiln_module_names " " KILN_MODULE_NAMES)

# libkiln.a calls the HDF5 C library: the installed package finds it by name (kiln::hdf5_c, which
# kiln_hdf5 stands for once installed), never by the build machine's path. Not with find_package(HDF5
# COMPONENTS C): FindHDF5 test-compiles a C file, which fails in a C++-only project.
set(KILN_CONFIG_HDF5 "")
if(NOT KILN_SHARED)
  set(_kiln_hdf5_names "")
  foreach(_lib IN LISTS HDF5_C_LIBRARIES)
    if(_lib MATCHES "hdf5[^/]*\\.(so|a)")
      get_filename_component(_real "${_lib}" REALPATH)
      foreach(_file IN ITEMS "${_real}" "${_lib}")  # libhdf5_serial.so.103.3.1 and libhdf5.so: hdf5_serial, hdf5
        get_filename_component(_name "${_file}" NAME)
        string(REGEX REPLACE "^lib([^.]+)\\..*$" "\\1" _name "${_name}")
        list(APPEND _kiln_hdf5_names ${_name})
      endforeach()
      break()
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _kiln_hdf5_names)
  list(JOIN _kiln_hdf5_names " " _kiln_hdf5_names)
  string(CONCAT KILN_CONFIG_HDF5
    "# The HDF5 C library libkiln.a calls, found by name (set KILN_HDF5_C_LIBRARY to choose one).\n"
    "if(NOT TARGET kiln::hdf5_c)\n"
    "  find_library(KILN_HDF5_C_LIBRARY NAMES ${_kiln_hdf5_names} PATH_SUFFIXES hdf5/serial\n"
    "               DOC \"the HDF5 C library that libkiln.a links\")\n"
    "  if(NOT KILN_HDF5_C_LIBRARY)\n"
    "    set(kiln_FOUND FALSE)\n"
    "    set(kiln_NOT_FOUND_MESSAGE \"kiln (static) needs the HDF5 C library (${_kiln_hdf5_names}): install it \"\n"
    "        \"(Debian: libhdf5-dev) or set KILN_HDF5_C_LIBRARY to its file\")\n"
    "    return()\n"
    "  endif()\n"
    "  add_library(kiln::hdf5_c UNKNOWN IMPORTED)\n"
    "  set_target_properties(kiln::hdf5_c PROPERTIES IMPORTED_LOCATION \"\${KILN_HDF5_C_LIBRARY}\")\n"
    "endif()\n")
endif()

# Installed package: relocatable (paths relative to kilnConfig.cmake), find modules copied beside it.
set(KILN_CONFIG_MODULE_DIR "${KILN_INSTALL_CMAKEDIR}/modules")
configure_package_config_file(cmake/kilnConfig.cmake.in ${PROJECT_BINARY_DIR}/install-config/kilnConfig.cmake
  INSTALL_DESTINATION ${KILN_INSTALL_CMAKEDIR}
  PATH_VARS KILN_CONFIG_MODULE_DIR)
# 0.x: a minor release may break the API, so only the same minor version satisfies a request.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/install-config/kilnConfig.cmake ${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake
  DESTINATION ${KILN_INSTALL_CMAKEDIR})
install(FILES cmake/FindCUDNN.cmake cmake/FindNCCL.cmake cmake/FindISAL.cmake DESTINATION ${KILN_CONFIG_MODULE_DIR})
install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION ${KILN_INSTALL_CMAKEDIR})

# Build-tree package: find_package(kiln) with kiln_DIR=<this build folder> uses the targets in
# place (headers from the source tree, libraries from the build tree), without installing.
set(KILN_CONFIG_MODULE_DIR "${PROJECT_SOURCE_DIR}/cmake")
set(KILN_CONFIG_HDF5 "")  # the build tree's targets name HDF5's files themselves
configure_package_config_file(cmake/kilnConfig.cmake.in ${PROJECT_BINARY_DIR}/kilnConfig.cmake
  INSTALL_DESTINATION ${PROJECT_BINARY_DIR}
  INSTALL_PREFIX ${PROJECT_BINARY_DIR}
  PATH_VARS KILN_CONFIG_MODULE_DIR)
export(EXPORT kilnTargets NAMESPACE kiln:: FILE ${PROJECT_BINARY_DIR}/kilnTargets.cmake)

# ---- a source-free binary archive: `cmake --build build --target package` ----
set(CPACK_PACKAGE_NAME kiln)
set(CPACK_PACKAGE_VENDOR "kiln")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "C++20 deep-learning training framework")
set(CPACK_GENERATOR TGZ)
set(CPACK_SOURCE_GENERATOR "")
include(CPack)
