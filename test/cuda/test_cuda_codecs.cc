// GPU codec kernels against the CPU ones: for the same arguments the device must write the
// same bytes and decode to the same values, bit for bit (docs/design.md's exact arithmetic).
// Needs a CUDA device: built whenever the kernels are, run by hand or by ctest when
// configured with -DGRADCOMP_GPU_TESTS=ON (docs/limitations.md, "GPU").
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "ops/common/half.h"
#include "ops/compression/cuda/codec_cuda.h"
#include "ops/compression/kernels.h"
#include "ops/compression/maxmin_math.h"
#include "ops/device/cuda_device.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {
namespace {

using codec_kernels::MaxMinArgs;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

/// A device buffer holding a copy of host bytes.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (cudaMalloc(&ptr, n == 0 ? 1 : n) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  void Upload(const void* host) const { cudaMemcpy(ptr, host, bytes, cudaMemcpyHostToDevice); }
  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> out(bytes);
    cudaMemcpy(out.data(), ptr, bytes, cudaMemcpyDeviceToHost);
    return out;
  }
};

/// n float32 values, some of them special when `specials` (NaN, infinities, -0.0, huge).
std::vector<float> Values(size_t n, uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng) * 3.0f + 0.25f;
  if (specials && n > 700) {
    v[3] = std::numeric_limits<float>::quiet_NaN();
    v[600] = std::numeric_limits<float>::infinity();
    v[601] = -0.0f;
    v[n - 1] = 3.0e38f;
    v[n - 2] = -3.0e38f;
  }
  return v;
}

/// `v` in the storage of `dtype` (float32, or the 16-bit patterns of float16 / bfloat16).
std::vector<uint8_t> Stored(const std::vector<float>& v, DataType dtype) {
  std::vector<uint8_t> out(v.size() * DataTypeSize(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DataType::kFloat32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = dtype == DataType::kFloat16 ? FloatToHalfBits(v[i]) : FloatToBFloat16Bits(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

void ExpectSameBits(const std::vector<uint8_t>& gpu, const std::vector<uint8_t>& cpu, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  for (size_t i = 0; i < gpu.size(); ++i) {
    ASSERT_EQ(gpu[i], cpu[i]) << what << ": first differing byte " << i << " of " << gpu.size();
  }
}

TEST(CudaCodecs, ADeviceIsPresent) {
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess) << "no usable CUDA driver";
  ASSERT_GT(devices, 0) << "this test needs a CUDA device";
}

/// Whether the sweep below runs (n, bits, bucket, variant). On a GPU: every case. On the emulated
/// GPU (a fiber per CUDA thread) the million-value size, which is what spans many blocks and
/// grid-stride loops, runs at the bit widths that pack differently (1: eight to a byte, 3: values
/// straddling bytes, 8: a byte each), one bucket and two variants; at every other size every case
/// runs. The full sweep at that size was 99% of the emulated test's 3 minutes.
bool Swept(size_t n, int bits, size_t bucket, int variant) {
#if GRADCOMP_CUDA_EMULATION
  if (n > (1u << 16)) return (bits == 1 || bits == 3 || bits == 8) && bucket == 512 && (variant == 0 || variant == 3);
#else
  (void)n, (void)bits, (void)bucket, (void)variant;
#endif
  return true;
}

TEST(CudaCodecs, MaxMinBytesAndValuesEqualTheCpu) {
  const size_t sizes[] = {1, 7, 8, 9, 100, 513, 4097, (1u << 20) + 3};
  const size_t buckets[] = {64, 100, 512};
  const DataType dtypes[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16};
  int cases = 0, skipped = 0;
  for (DataType dtype : dtypes) {
    for (size_t n : sizes) {
      const std::vector<float> values = Values(n, static_cast<uint32_t>(n), n % 2 == 1);
      const std::vector<uint8_t> input = Stored(values, dtype);
      DeviceBuffer d_in(input.size());
      d_in.Upload(input.data());
      for (int bits = 1; bits <= 8; ++bits) {
        for (size_t bucket : buckets) {
          for (int variant = 0; variant < 4; ++variant) {
            if (!Swept(n, bits, bucket, variant)) {
              ++skipped;
              continue;
            }
            MaxMinArgs a{bits, bucket, (variant & 1) != 0, (variant & 2) != 0, 42, 7,
                         variant == 3 ? (uint64_t{1} << 32) - 5 : uint64_t{123}};
            const std::string what = std::string(DataTypeName(dtype)) + " n=" + std::to_string(n) +
                                     " bits=" + std::to_string(bits) + " bucket=" + std::to_string(bucket) +
                                     " variant=" + std::to_string(variant);
            const size_t wire = maxmin::WireBytes(n, bits, bucket, a.skip_incomplete);
            std::vector<uint8_t> cpu(wire);
            ASSERT_EQ(codec_kernels::scalar::MaxMinEncode(input.data(), dtype, n, a, cpu.data()), wire) << what;
            DeviceBuffer d_wire(wire);
            ASSERT_EQ(cuda::MaxMinEncode(d_in.ptr, dtype, n, a, static_cast<uint8_t*>(d_wire.ptr), nullptr), wire);
            CUDA_OK(cudaDeviceSynchronize());
            ExpectSameBits(d_wire.Download(), cpu, "encode " + what);

            // Decode and decode-accumulate into the same dtype, from the same start values.
            for (bool accumulate : {false, true}) {
              std::vector<uint8_t> cpu_out = input;
              codec_kernels::scalar::MaxMinDecode(cpu.data(), n, a, dtype, cpu_out.data(), accumulate);
              DeviceBuffer d_out(input.size());
              d_out.Upload(input.data());
              cuda::MaxMinDecode(static_cast<const uint8_t*>(d_wire.ptr), n, a, dtype, d_out.ptr, accumulate, nullptr);
              CUDA_OK(cudaDeviceSynchronize());
              ExpectSameBits(d_out.Download(), cpu_out, (accumulate ? "decode-accumulate " : "decode ") + what);
            }
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases + skipped, 3 * 8 * 8 * 3 * 4);
#if GRADCOMP_CUDA_EMULATION
  EXPECT_EQ(skipped, 3 * (8 * 3 * 4 - 3 * 1 * 2));
#else
  EXPECT_EQ(skipped, 0);
#endif
}

TEST(CudaCodecs, CastsEqualTheCpu) {
  const DataType dtypes[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16};
  const size_t n = 100003;
  const std::vector<float> values = Values(n, 5, true);
  for (DataType from : dtypes) {
    for (DataType to : dtypes) {
      for (bool accumulate : {false, true}) {
        const std::vector<uint8_t> in = Stored(values, from);
        std::vector<uint8_t> cpu = Stored(values, to);
        kernels_scalar::Cast(in.data(), from, n, cpu.data(), to, accumulate);
        DeviceBuffer d_in(in.size()), d_out(cpu.size());
        d_in.Upload(in.data());
        const std::vector<uint8_t> start = Stored(values, to);
        d_out.Upload(start.data());
        cuda::Cast(d_in.ptr, from, n, d_out.ptr, to, accumulate, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        ExpectSameBits(d_out.Download(), cpu, std::string("cast ") + DataTypeName(from) + " -> " + DataTypeName(to) +
                                                  (accumulate ? " (accumulate)" : ""));
      }
    }
  }
}

}  // namespace
}  // namespace gradcomp
