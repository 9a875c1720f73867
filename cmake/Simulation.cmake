# GRADCOMP_SIMULATION: the data plane (ops/) and its driver built against SimGrid's SMPI
# (Debian's libsimgrid-dev) instead of Open MPI, so the real algorithms and codecs run as the
# ranks of a simulated cluster (examples/benchmarks/simulate.py). Nothing else is built: the
# runtime's background thread, the frameworks and the tests need a real MPI.
#
# SMPI's mpi.h stands in for MPI::MPI_C. Programs are shared objects that smpirun loads (what
# smpicxx makes); globals are not privatized per rank (smpirun -no-privatize), which ops/
# allows: its only process-wide state is constant tables and the host device.
find_path(SIMGRID_SMPI_INCLUDE_DIR mpi.h PATHS /usr/include/smpi NO_DEFAULT_PATH)
find_library(SIMGRID_LIBRARY simgrid)
find_program(SIMGRID_SMPIRUN smpirun)
if(NOT SIMGRID_SMPI_INCLUDE_DIR OR NOT SIMGRID_LIBRARY OR NOT SIMGRID_SMPIRUN)
  message(FATAL_ERROR "GRADCOMP_SIMULATION=ON needs SimGrid's SMPI: apt-get install libsimgrid-dev")
endif()
find_package(Threads REQUIRED)
add_library(MPI::MPI_C INTERFACE IMPORTED)
set_target_properties(MPI::MPI_C PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${SIMGRID_SMPI_INCLUDE_DIR}"
  INTERFACE_LINK_LIBRARIES "${SIMGRID_LIBRARY}"
  INTERFACE_COMPILE_DEFINITIONS "GRADCOMP_SIMULATION=1")
set(MPIEXEC_EXECUTABLE ${SIMGRID_SMPIRUN})
set(GRADCOMP_HAVE_CUDA 0)
set(GRADCOMP_HAVE_NCCL 0)
set(GRADCOMP_HAVE_CUDA_KERNELS 0)
set(GRADCOMP_HAVE_NCCL_COMMUNICATOR 0)
set(GRADCOMP_AVX2_FLAGS -mavx2 -mf16c)
