# kiln_onnx.cmake — the C++ of ONNX's protobuf messages, for ONNX export (io::export_onnx). Included by the top-level
# CMakeLists.txt when KILN_ONNX is ON; defines the static library kiln_onnx_proto, which kiln_io links privately:
#
#   #include "kiln_onnx/onnx.pb.h"   // kiln_onnx::ModelProto, GraphProto, NodeProto, TensorProto, ...
#
# onnx.proto is ONNX's own schema, from the onnx wheel (scripts/setup.sh puts it into third_party/onnx/, or set
# KILN_ONNX_PROTO). Two lines change before protoc sees it (build/onnx_proto/kiln_onnx/onnx.proto):
# - `package onnx;` becomes `package kiln_onnx;`, and the file is registered as kiln_onnx/onnx.proto: kiln's classes
#   and descriptors cannot clash with those of a real onnx library or ONNX Runtime loaded into the same process;
# - its `option optimize_for = LITE_RUNTIME;` goes: the full runtime (DebugString and the text format help when a
#   model is wrong). The bytes on the wire are the same either way.
#
# protobuf: the system's (CMake's FindProtobuf; Debian: libprotobuf-dev, protobuf-compiler), else the copy
# scripts/setup.sh puts into third_party/protobuf (headers, libprotobuf.so*, protoc and its libprotoc.so*) for machines
# without a package source. protoc, the headers and the library always come from one installation, so the generated
# code matches the libprotobuf it links. Nothing of protobuf reaches kiln's public headers.

set(KILN_ONNX_PROTO "${PROJECT_SOURCE_DIR}/third_party/onnx/onnx.proto" CACHE FILEPATH
    "ONNX's onnx.proto, which kiln's ONNX export is generated from (scripts/setup.sh fetches it)")
set(_kiln_onnx_fix "run scripts/setup.sh (it installs protobuf, and puts onnx.proto into third_party/onnx), or \
configure with -DKILN_ONNX=OFF to build kiln without ONNX export")

# ---- protobuf: the system's, else third_party/protobuf ----
set(_kiln_protobuf_copy "${PROJECT_SOURCE_DIR}/third_party/protobuf")
set(_kiln_protobuf_use_copy FALSE)
string(FIND "${Protobuf_PROTOC_EXECUTABLE}" "${_kiln_protobuf_copy}/" _at)
if(_at EQUAL 0)
  set(_kiln_protobuf_use_copy TRUE)  # an earlier configure chose the copy
else()
  find_package(Protobuf QUIET)
  # The copy only where the system has no protobuf library and headers (then FindProtobuf defines no target yet).
  if(NOT Protobuf_FOUND AND EXISTS "${_kiln_protobuf_copy}/bin/protoc")
    set(_kiln_protobuf_use_copy TRUE)
    # Forget what was found of a partial system installation (a protoc, say): all from one place.
    foreach(_var Protobuf_INCLUDE_DIR Protobuf_LIBRARY Protobuf_LIBRARY_RELEASE Protobuf_LIBRARY_DEBUG
                 Protobuf_LITE_LIBRARY Protobuf_LITE_LIBRARY_RELEASE Protobuf_LITE_LIBRARY_DEBUG Protobuf_PROTOC_LIBRARY
                 Protobuf_PROTOC_LIBRARY_RELEASE Protobuf_PROTOC_LIBRARY_DEBUG Protobuf_PROTOC_EXECUTABLE)
      unset(${_var} CACHE)
      unset(${_var})
    endforeach()
  endif()
endif()
set(KILN_PROTOC_ENV "")  # how protoc is run: the copy needs its libprotoc.so beside it
if(_kiln_protobuf_use_copy)
  set(KILN_PROTOC_ENV ${CMAKE_COMMAND} -E env "LD_LIBRARY_PATH=${_kiln_protobuf_copy}/lib")
  set(_kiln_saved_ld_path "$ENV{LD_LIBRARY_PATH}")
  set(ENV{LD_LIBRARY_PATH} "${_kiln_protobuf_copy}/lib")  # FindProtobuf runs protoc --version
  set(Protobuf_ROOT "${_kiln_protobuf_copy}")
  find_package(Protobuf QUIET)
  set(ENV{LD_LIBRARY_PATH} "${_kiln_saved_ld_path}")
endif()
if(NOT Protobuf_FOUND OR NOT TARGET protobuf::libprotobuf)
  message(FATAL_ERROR "KILN_ONNX: protobuf (its headers, libprotobuf and protoc) was not found, neither on the system "
                      "nor in third_party/protobuf: ${_kiln_onnx_fix}")
endif()
if(NOT Protobuf_PROTOC_EXECUTABLE)
  message(FATAL_ERROR "KILN_ONNX: protobuf ${Protobuf_VERSION} was found (${Protobuf_INCLUDE_DIR}), but not its compiler "
                      "protoc (Debian: protobuf-compiler): ${_kiln_onnx_fix}")
endif()
if(NOT EXISTS "${KILN_ONNX_PROTO}")
  message(FATAL_ERROR "KILN_ONNX: ONNX's schema ${KILN_ONNX_PROTO} is missing: ${_kiln_onnx_fix}")
endif()
message(STATUS "ONNX export: protobuf ${Protobuf_VERSION} (${Protobuf_PROTOC_EXECUTABLE}), ${KILN_ONNX_PROTO}")

# ---- onnx.proto as package kiln_onnx (at configure time; again whenever onnx.proto changes) ----
set(_kiln_onnx_out "${PROJECT_BINARY_DIR}/onnx_proto")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${KILN_ONNX_PROTO}")
file(READ "${KILN_ONNX_PROTO}" _proto)
string(REGEX REPLACE "(^|\n)package onnx;" "\\1package kiln_onnx;" _kiln_proto "${_proto}")
if(_kiln_proto STREQUAL _proto)
  message(FATAL_ERROR "KILN_ONNX: ${KILN_ONNX_PROTO} has no line 'package onnx;' (is it ONNX's onnx.proto?)")
endif()
string(REGEX REPLACE "\noption optimize_for = LITE_RUNTIME;" "\n" _kiln_proto "${_kiln_proto}")
set(_kiln_onnx_proto "${_kiln_onnx_out}/kiln_onnx/onnx.proto")
set(_old "")
if(EXISTS "${_kiln_onnx_proto}")
  file(READ "${_kiln_onnx_proto}" _old)
endif()
if(NOT _old STREQUAL _kiln_proto)  # written only when it changes: no rebuild after each configure
  file(WRITE "${_kiln_onnx_proto}" "${_kiln_proto}")
endif()

# ---- protoc at build time, and the library ----
add_custom_command(
  OUTPUT ${_kiln_onnx_out}/kiln_onnx/onnx.pb.h ${_kiln_onnx_out}/kiln_onnx/onnx.pb.cc
  COMMAND ${KILN_PROTOC_ENV} ${Protobuf_PROTOC_EXECUTABLE} --proto_path=${_kiln_onnx_out}
          --cpp_out=${_kiln_onnx_out} ${_kiln_onnx_proto}
  DEPENDS ${_kiln_onnx_proto} ${Protobuf_PROTOC_EXECUTABLE}
  COMMENT "protoc: ONNX's messages as kiln_onnx/onnx.pb.h, .cc"
  VERBATIM)
# Static and position-independent (it goes into libkiln.so); generated code: none of kiln's warnings. Its folder is
# a system include folder for the code that includes onnx.pb.h, so kiln's warnings skip it there too.
add_library(kiln_onnx_proto STATIC ${_kiln_onnx_out}/kiln_onnx/onnx.pb.cc)
set_target_properties(kiln_onnx_proto PROPERTIES POSITION_INDEPENDENT_CODE ON EXPORT_NAME onnx_proto)
target_include_directories(kiln_onnx_proto SYSTEM PUBLIC $<BUILD_INTERFACE:${_kiln_onnx_out}>)
target_link_libraries(kiln_onnx_proto PUBLIC protobuf::libprotobuf)
target_compile_features(kiln_onnx_proto PUBLIC cxx_std_20)

unset(_kiln_onnx_fix)
unset(_kiln_protobuf_use_copy)
unset(_kiln_saved_ld_path)
unset(_at)
unset(_proto)
unset(_kiln_proto)
unset(_old)
