# Third-party dependencies, all from Debian packages (scripts/install_deps.sh).
find_package(MPI REQUIRED COMPONENTS C)
find_package(Threads REQUIRED)
find_package(spdlog REQUIRED)

# Python modules are built for Debian's interpreter (the one with torch), not whatever
# python3 comes first on PATH.
set(GRADCOMP_PYTHON "/usr/bin/python3" CACHE FILEPATH "Python interpreter the modules are built for")
set(Python_EXECUTABLE ${GRADCOMP_PYTHON})
set(PYBIND11_FINDPYTHON ON)
find_package(Python COMPONENTS Interpreter Development.Module REQUIRED)
find_package(pybind11 CONFIG REQUIRED)

# CUDA and NCCL are detected, never required: without them the CPU path builds alone.
set(GRADCOMP_HAVE_CUDA 0)
set(GRADCOMP_HAVE_NCCL 0)
if(NOT GRADCOMP_WITH_CUDA STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(GRADCOMP_HAVE_CUDA 1)
  elseif(GRADCOMP_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "GRADCOMP_WITH_CUDA=ON but no CUDA toolkit was found")
  endif()
endif()
if(GRADCOMP_HAVE_CUDA AND NOT GRADCOMP_WITH_NCCL STREQUAL "OFF")
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} $ENV{NCCL_HOME}/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} $ENV{NCCL_HOME}/lib)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(GRADCOMP_HAVE_NCCL 1)
  endif()
endif()
if(GRADCOMP_WITH_NCCL STREQUAL "ON" AND NOT GRADCOMP_HAVE_NCCL)
  message(FATAL_ERROR "GRADCOMP_WITH_NCCL=ON but nccl.h / libnccl were not found (set NCCL_HOME)")
endif()

# Run-time dispatched SIMD: files compiled with these flags are only entered after a CPUID check.
set(GRADCOMP_AVX2_FLAGS -mavx2 -mf16c)
