# Multi-process tests (included by tests/CMakeLists.txt). A job started by hand through the TCP rendezvous
# (launch_child, run_tcp_test.sh) needs no MPI; it runs first.
add_executable(launch_child distributed/launch_child.cpp)
target_link_libraries(launch_child PRIVATE kiln::kiln kiln_warnings)
add_test(NAME distributed.tcp_bootstrap
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/run_tcp_test.sh $<TARGET_FILE:launch_child>)
set_tests_properties(distributed.tcp_bootstrap PROPERTIES LABELS mpi TIMEOUT 180 ENVIRONMENT NCCL_NVLS_ENABLE=0)

# Multi-process tests under MPI: tests/distributed/test_mpi_*.cpp form one GoogleTest
# binary that CTest runs under `mpirun -np 2` (label mpi): CPU tensors through the MPI group on every machine,
# and, where each rank has a GPU, CUDA tensors through NCCL. failure_child is a program whose ranks time out or
# die on purpose; run_failure_test.sh checks that the job then ends, non-zero, with the expected message.
if(NOT KILN_MPI)
  return()
endif()
file(GLOB _kiln_mpi_test_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/distributed/test_mpi_*.cpp)
if(NOT _kiln_mpi_test_sources)
  return()
endif()
add_executable(test_distributed_mpi ${_kiln_mpi_test_sources})
target_link_libraries(test_distributed_mpi PRIVATE kiln_test_support GTest::gtest_main kiln_warnings)
if(KILN_CUDA)
  target_compile_definitions(test_distributed_mpi PRIVATE KILN_TEST_CUDA=1)
endif()
add_executable(failure_child distributed/failure_child.cpp)
target_link_libraries(failure_child PRIVATE kiln::kiln kiln_warnings)

# Open MPI refuses to start as root without these (CI containers run as root); --oversubscribe lets 2 ranks
# run where Open MPI counts fewer slots.
set(_kiln_mpirun ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe)
set(_kiln_mpi_env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    NCCL_NVLS_ENABLE=0)
add_test(NAME distributed.mpi_np2 COMMAND ${_kiln_mpirun} -x NCCL_NVLS_ENABLE $<TARGET_FILE:test_distributed_mpi>)
set_tests_properties(distributed.mpi_np2 PROPERTIES LABELS mpi TIMEOUT 900
  ENVIRONMENT "${_kiln_mpi_env};KILN_DIST_TIMEOUT_S=300")
foreach(mode hang_exit hang_throw kill)
  add_test(NAME distributed.failure_${mode}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/distributed/run_failure_test.sh ${mode} $<TARGET_FILE:failure_child>
            ${_kiln_mpirun})
  set_tests_properties(distributed.failure_${mode} PROPERTIES LABELS mpi TIMEOUT 180 ENVIRONMENT "${_kiln_mpi_env}")
endforeach()
