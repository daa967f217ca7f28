# Builds and runs tests/install/consumer against kiln, as a user's project would. Run with cmake -P:
#
#   cmake -DMODE=install|build-tree -DKILN_BUILD_DIR=<kiln build> -DWORK_DIR=<scratch folder>
#         -DCONSUMER_DIR=<tests/install/consumer> [-DKILN_SOURCE_DIR=<kiln source>] [-DGENERATOR=Ninja]
#         [-DCXX_COMPILER=...] [-DBUILD_TYPE=Release] [-DLAUNCHER=ccache] -P check_consumer.cmake
#
# MODE=install     installs KILN_BUILD_DIR into WORK_DIR/staging (cmake --install), MOVES that prefix to
#                  WORK_DIR/moved/kiln, checks what was installed (no path of the build machine in the
#                  package files or in libkiln.so's run path), then finds kiln there through
#                  CMAKE_PREFIX_PATH. For a shared kiln the consumer is configured with CUDA, cuDNN, NCCL,
#                  MPI, HDF5 and the image libraries' packages disabled and nvcc off PATH: a program that
#                  uses kiln on the CPU needs none of them.
# MODE=build-tree  finds kiln in its build folder (kiln_DIR=KILN_BUILD_DIR), nothing installed.
#
# Both build and run three programs: consumer (one tensor), mlp (a small MLP whose loss must fall) and
# tensor_only (linked with kiln::tensor alone, which must be the whole library).
cmake_minimum_required(VERSION 3.24)

foreach(var MODE KILN_BUILD_DIR WORK_DIR CONSUMER_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_consumer: pass -D${var}=...")
  endif()
endforeach()
if(NOT MODE MATCHES "^(install|build-tree)$")
  message(FATAL_ERROR "check_consumer: MODE must be install or build-tree, not '${MODE}'")
endif()

# Runs one command; on failure prints its output and stops with a message naming the step.
function(run_step what)
  message(STATUS "check_consumer [${MODE}]: ${what}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "check_consumer [${MODE}]: ${what} failed (exit ${rc}):\n  ${ARGN}\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(configure_args -S "${CONSUMER_DIR}" -B "${WORK_DIR}/build")
if(GENERATOR)
  list(APPEND configure_args -G "${GENERATOR}")
endif()
if(CXX_COMPILER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
if(BUILD_TYPE)
  list(APPEND configure_args "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
endif()
if(LAUNCHER)
  # Through an initial cache file: a launcher may be a list (env CCACHE_BASEDIR=... ccache).
  file(WRITE "${WORK_DIR}/launcher.cmake" "set(CMAKE_CXX_COMPILER_LAUNCHER \"${LAUNCHER}\" CACHE STRING \"\")\n")
  list(APPEND configure_args -C "${WORK_DIR}/launcher.cmake")
endif()

set(configure_command "${CMAKE_COMMAND}")
if(MODE STREQUAL "install")
  set(staging "${WORK_DIR}/staging")
  set(prefix "${WORK_DIR}/moved/kiln")
  run_step("install kiln into ${staging}" "${CMAKE_COMMAND}" --install "${KILN_BUILD_DIR}" --prefix "${staging}")
  # The prefix moves: nothing may depend on where it was installed.
  file(MAKE_DIRECTORY "${WORK_DIR}/moved")
  file(RENAME "${staging}" "${prefix}")
  message(STATUS "check_consumer [install]: moved ${staging} to ${prefix}")

  set(config_file "${prefix}/lib/cmake/kiln/kilnConfig.cmake")
  if(NOT EXISTS "${config_file}")
    message(FATAL_ERROR "check_consumer [install]: lib/cmake/kiln/kilnConfig.cmake was not installed")
  endif()
  file(STRINGS "${config_file}" shared_line REGEX "^set\\(kiln_SHARED ")
  if(shared_line MATCHES "ON")
    set(shared TRUE)
  else()
    set(shared FALSE)
  endif()
  message(STATUS "check_consumer [install]: shared library: ${shared}")

  # What must be there, and what must not: backend internals and anything naming Eigen.
  set(required_files include/kiln/kiln.h include/kiln/version.h include/kiln/tensor/tensor.h
      lib/cmake/kiln/kilnConfig.cmake lib/cmake/kiln/kilnConfigVersion.cmake lib/cmake/kiln/kilnTargets.cmake)
  if(shared)
    list(APPEND required_files lib/libkiln.so)
  else()
    list(APPEND required_files lib/libkiln.a)
  endif()
  foreach(required IN LISTS required_files)
    if(NOT EXISTS "${prefix}/${required}")
      message(FATAL_ERROR "check_consumer [install]: ${required} was not installed")
    endif()
  endforeach()
  # One kiln library: no module is a library of its own (libkiln_tensor.a could not link by itself). Only the
  # helpers libkiln_nvml.a and libkiln_onnx_proto.a (ONNX's messages), which libkiln.a's link interface names, may sit
  # beside it.
  file(GLOB kiln_archives RELATIVE "${prefix}/lib" "${prefix}/lib/libkiln*")
  list(FILTER kiln_archives EXCLUDE REGEX "^libkiln\\.(a|so(\\.[0-9.]+)?)$|^libkiln_(nvml|onnx_proto)\\.a$")
  if(kiln_archives)
    message(FATAL_ERROR "check_consumer [install]: libraries other than libkiln were installed: ${kiln_archives} "
                        "(the modules' objects belong in libkiln)")
  endif()
  foreach(private_dir include/kiln/tensor/cpu include/kiln/tensor/cuda)
    if(EXISTS "${prefix}/${private_dir}")
      message(FATAL_ERROR "check_consumer [install]: backend-internal ${private_dir} was installed")
    endif()
  endforeach()
  file(GLOB target_files "${prefix}/lib/cmake/kiln/kilnTargets*.cmake")
  foreach(file IN LISTS target_files)
    file(READ "${file}" text)
    if(text MATCHES "Eigen")
      message(FATAL_ERROR "check_consumer [install]: ${file} refers to Eigen, which must stay private")
    endif()
  endforeach()

  # The package files name no file or folder of the machine that built kiln: no absolute path at all
  # outside comments (e.g. /usr/lib/x86_64-linux-gnu/hdf5/serial/libhdf5.so, the build folder). Paths are
  # relative to the files themselves (${_IMPORT_PREFIX}, ${PACKAGE_PREFIX_DIR}). The find modules kiln ships
  # (modules/, static builds) search the usual folders, but must not name the build or source folder either.
  set(build_paths "${KILN_BUILD_DIR}" "${staging}")
  if(KILN_SOURCE_DIR)
    list(APPEND build_paths "${KILN_SOURCE_DIR}")
  endif()
  file(GLOB package_files "${prefix}/lib/cmake/kiln/*.cmake")
  file(GLOB_RECURSE module_files "${prefix}/lib/cmake/kiln/modules/*.cmake")
  foreach(file IN LISTS package_files module_files)
    file(READ "${file}" text)
    foreach(path IN LISTS build_paths)
      string(FIND "${text}" "${path}" at)
      if(NOT at EQUAL -1)
        message(FATAL_ERROR "check_consumer [install]: ${file} names ${path}, a folder of the build machine")
      endif()
    endforeach()
  endforeach()
  foreach(file IN LISTS package_files)
    file(STRINGS "${file}" lines)
    foreach(line IN LISTS lines)
      if(line MATCHES "^[ \t]*#")
        continue()
      endif()
      if(line MATCHES "(^|[^A-Za-z0-9_.}+-])(/[A-Za-z0-9_.+-]+/[^\" ;)]*)")
        message(FATAL_ERROR "check_consumer [install]: ${file} names the absolute path ${CMAKE_MATCH_2} "
                            "(the package must not depend on the build machine's folders):\n  ${line}")
      endif()
    endforeach()
  endforeach()

  if(shared)
    # Private dependencies stay inside libkiln.so: the package looks for none of them.
    foreach(file IN LISTS package_files)
      file(READ "${file}" text)
      if(text MATCHES "find_dependency\\((CUDAToolkit|CUDNN|NCCL|MPI|HDF5|JPEG|PNG|ZLIB)")
        message(FATAL_ERROR "check_consumer [install]: ${file} looks for ${CMAKE_MATCH_1}, a private dependency "
                            "of the shared libkiln.so")
      endif()
    endforeach()
    # libkiln.so finds nothing through the build tree: its run path names no build or source folder.
    file(READ_ELF "${prefix}/lib/libkiln.so" RUNPATH runpath RPATH rpath CAPTURE_ERROR elf_error)
    if(elf_error)
      message(FATAL_ERROR "check_consumer [install]: cannot read lib/libkiln.so: ${elf_error}")
    endif()
    message(STATUS "check_consumer [install]: libkiln.so run path: '${runpath}${rpath}'")
    foreach(path IN LISTS build_paths)
      string(FIND "${runpath};${rpath}" "${path}" at)
      if(NOT at EQUAL -1)
        message(FATAL_ERROR "check_consumer [install]: libkiln.so's run path '${runpath}${rpath}' names ${path}")
      endif()
    endforeach()

    # The consumer's configure may not find CUDA, cuDNN, NCCL, MPI or HDF5 even by accident: their packages
    # are disabled and nvcc is off PATH.
    foreach(package CUDAToolkit CUDA CUDNN NCCL MPI HDF5 JPEG PNG ZLIB Eigen3)
      list(APPEND configure_args "-DCMAKE_DISABLE_FIND_PACKAGE_${package}=ON")
    endforeach()
    set(clean_path "")
    string(REPLACE ":" ";" path_entries "$ENV{PATH}")
    foreach(entry IN LISTS path_entries)
      if(NOT entry MATCHES "cuda" AND NOT EXISTS "${entry}/nvcc")
        list(APPEND clean_path "${entry}")
      endif()
    endforeach()
    string(REPLACE ";" ":" clean_path "${clean_path}")
    set(configure_command "${CMAKE_COMMAND}" -E env --unset=CUDAToolkit_ROOT --unset=CUDA_PATH --unset=CUDA_HOME
        --unset=CUDACXX "PATH=${clean_path}" "${CMAKE_COMMAND}")
  endif()

  # One source that includes every installed header, compiled by the consumer project.
  file(GLOB_RECURSE headers RELATIVE "${prefix}/include" "${prefix}/include/*.h")
  list(SORT headers)
  set(check_source "// Generated by check_consumer.cmake: every installed kiln header.\n")
  foreach(header IN LISTS headers)
    string(APPEND check_source "#include <${header}>\n")
  endforeach()
  file(WRITE "${WORK_DIR}/header_check.cpp" "${check_source}")
  list(LENGTH headers header_count)
  message(STATUS "check_consumer [install]: ${header_count} headers installed")

  # CMAKE_FIND_USE_PACKAGE_REGISTRY=OFF: only this prefix may provide kiln.
  list(APPEND configure_args "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF"
       "-DKILN_HEADER_CHECK_SOURCE=${WORK_DIR}/header_check.cpp")
  set(expected_kiln_dir "${prefix}/lib/cmake/kiln")
else()
  set(shared FALSE)
  list(APPEND configure_args "-Dkiln_DIR=${KILN_BUILD_DIR}")
  set(expected_kiln_dir "${KILN_BUILD_DIR}")
endif()

run_step("configure the consumer" ${configure_command} ${configure_args})
# The kiln that was found must be the one under test, not another one on the system.
file(STRINGS "${WORK_DIR}/build/CMakeCache.txt" kiln_dir_line REGEX "^kiln_DIR:")
string(REGEX REPLACE "^kiln_DIR:[A-Z]+=" "" found_kiln_dir "${kiln_dir_line}")
file(REAL_PATH "${found_kiln_dir}" found_kiln_dir)
file(REAL_PATH "${expected_kiln_dir}" expected_kiln_dir)
if(NOT found_kiln_dir STREQUAL expected_kiln_dir)
  message(FATAL_ERROR "check_consumer [${MODE}]: found kiln in ${found_kiln_dir}, expected ${expected_kiln_dir}")
endif()

if(shared)
  file(STRINGS "${WORK_DIR}/build/CMakeCache.txt" cuda_lines REGEX "^(CUDAToolkit|CUDNN|NCCL|CMAKE_CUDA_COMPILER)[A-Za-z_]*:")
  if(cuda_lines)
    message(FATAL_ERROR "check_consumer [${MODE}]: configuring the consumer looked for CUDA:\n  ${cuda_lines}")
  endif()
endif()

run_step("build the consumer" "${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
foreach(program consumer mlp tensor_only)
  run_step("run ${program}" "${WORK_DIR}/build/${program}")
  message(STATUS "check_consumer [${MODE}]: ${program} printed:\n${step_output}")
  if(NOT step_output MATCHES "${program} ok")
    message(FATAL_ERROR "check_consumer [${MODE}]: ${program} did not print '${program} ok'")
  endif()
endforeach()
message(STATUS "check_consumer [${MODE}]: passed")
