// GC_HD marks the small arithmetic helpers (half.h, maxmin_math.h) that CUDA kernels share
// with the CPU codecs, so both compute the same bits. Empty outside nvcc.
#pragma once

#if defined(__CUDACC__)
#define GC_HD __host__ __device__
#else
#define GC_HD
#endif
