# FindISAL.cmake — Intel's Intelligent Storage Acceleration Library (ISA-L), whose crc32_iscsi is the CRC-32C
# (Castagnoli) that TensorBoard's TFRecord framing needs (kiln/monitor/metrics_tfrecord.cpp).
#
#   find_package(ISAL REQUIRED)
#
# Looks in ISAL_ROOT (CMake or environment variable) and the system (Debian and Ubuntu: libisal-dev), then in
# third_party/isal of the kiln source tree (scripts/setup.sh copies Debian's libisal-dev there, so that it travels to
# machines without a package source).
#
# Defines ISAL_FOUND, ISAL_VERSION, ISAL_INCLUDE_DIR, ISAL_LIBRARY and the imported target ISAL::ISAL.

set(_isal_hints)
if(DEFINED ENV{ISAL_ROOT})
  list(APPEND _isal_hints $ENV{ISAL_ROOT})
endif()
if(ISAL_ROOT)
  list(APPEND _isal_hints ${ISAL_ROOT})
endif()
find_path(ISAL_INCLUDE_DIR isa-l/crc.h HINTS ${_isal_hints} PATH_SUFFIXES include
          DOC "the folder holding isa-l/crc.h (ISA-L)")
find_library(ISAL_LIBRARY NAMES isal HINTS ${_isal_hints} PATH_SUFFIXES lib lib64 DOC "ISA-L's library (libisal)")
# Then the copy in the kiln tree this module belongs to, or, for the copy kiln installs (<prefix>/lib/cmake/kiln/
# modules/), the prefix, where a static kiln built with third_party's ISA-L installs it (cmake/kiln_install.cmake).
set(_isal_third_party ${CMAKE_CURRENT_LIST_DIR}/../third_party/isal)
get_filename_component(_isal_prefix ${CMAKE_CURRENT_LIST_DIR}/../../../.. ABSOLUTE)
find_path(ISAL_INCLUDE_DIR isa-l/crc.h HINTS ${_isal_third_party}/include ${_isal_prefix}/include NO_DEFAULT_PATH)
find_library(ISAL_LIBRARY NAMES isal HINTS ${_isal_third_party}/lib ${_isal_prefix}/lib ${_isal_prefix}/lib64
             NO_DEFAULT_PATH)
unset(_isal_third_party)
unset(_isal_prefix)
unset(_isal_hints)

if(ISAL_INCLUDE_DIR AND EXISTS "${ISAL_INCLUDE_DIR}/isa-l.h")
  file(STRINGS "${ISAL_INCLUDE_DIR}/isa-l.h" _isal_version_lines REGEX "#define ISAL_(MAJOR|MINOR|PATCH)_VERSION ")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define ISAL_${_part}_VERSION ([0-9]+).*" "\\1" _isal_${_part} "${_isal_version_lines}")
  endforeach()
  set(ISAL_VERSION "${_isal_MAJOR}.${_isal_MINOR}.${_isal_PATCH}")
  unset(_isal_version_lines)
  unset(_isal_MAJOR)
  unset(_isal_MINOR)
  unset(_isal_PATCH)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(ISAL
  REQUIRED_VARS ISAL_LIBRARY ISAL_INCLUDE_DIR
  VERSION_VAR ISAL_VERSION
  FAIL_MESSAGE "ISA-L not found: install it (Debian/Ubuntu: apt-get install libisal-dev, as scripts/setup.sh does) or set ISAL_ROOT")
mark_as_advanced(ISAL_INCLUDE_DIR ISAL_LIBRARY)

if(ISAL_FOUND AND NOT TARGET ISAL::ISAL)
  add_library(ISAL::ISAL UNKNOWN IMPORTED)
  set_target_properties(ISAL::ISAL PROPERTIES
    IMPORTED_LOCATION "${ISAL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${ISAL_INCLUDE_DIR}")
endif()
