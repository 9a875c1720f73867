// Element types of the CUDA kernels (cuda_device.cu, ops/compression/cuda/): each loads its
// value as float32 and stores a float32 rounded as the CPU kernels round it (half.h).
#pragma once

#include <cstdint>

#include "ops/common/half.h"

namespace gradcomp::cuda {

struct F32 {
  using T = float;
  __device__ static float Load(const T* p) { return *p; }
  __device__ static void Store(T* p, float v) { *p = v; }
};

struct F16 {
  using T = uint16_t;
  __device__ static float Load(const T* p) { return HalfBitsToFloat(*p); }
  __device__ static void Store(T* p, float v) { *p = FloatToHalfBits(v); }
};

struct BF16 {
  using T = uint16_t;
  __device__ static float Load(const T* p) { return BFloat16BitsToFloat(*p); }
  __device__ static void Store(T* p, float v) { *p = FloatToBFloat16Bits(v); }
};

}  // namespace gradcomp::cuda
