# cmake -DIN=file.cu -DOUT=file.cc -P EmulateCuda.cmake
# A CUDA source as host C++ for the emulated runtime (test/support/cuda_emulation/cuda_runtime.h):
# each launch `K<<<cfg>>>(args)` becomes `::gc_cuda_emulation::Launcher(K, "K",
# ::gc_cuda_emulation::Config(cfg))(args)`; a #line keeps diagnostics on the original file.
file(READ "${IN}" text)
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_]*(<[^<>;(){}]*>)?)<<<"
       "::gc_cuda_emulation::Launcher(\\1, \"\\1\", ::gc_cuda_emulation::Config(" text "${text}")
string(REPLACE ">>>(" "))(" text "${text}")
if(text MATCHES "<<<|>>>")
  message(FATAL_ERROR "EmulateCuda: a launch in ${IN} is not of the form K<<<cfg>>>(args)")
endif()
file(WRITE "${OUT}.tmp" "#line 1 \"${IN}\"\n${text}")
file(RENAME "${OUT}.tmp" "${OUT}")
