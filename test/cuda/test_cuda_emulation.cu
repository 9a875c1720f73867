// The emulated CUDA runtime (test/support/cuda_emulation) catches what it says it catches: work
// that runs only when the host synchronizes, host access to device memory, kernel arguments
// that are not device memory, bad launch configurations, and it runs barriers and warp shuffles
// in lockstep; under TSan, a block's threads racing are reported. Built only against the
// emulation (cmake/EmulateCuda.cmake rewrites the launches).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

__global__ void AddOne(float* v, size_t n) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i < n) v[i] += 1.0f;
}

// Each block sums its 256 values through shared memory, halving with a barrier each time.
__global__ void BlockSums(const uint32_t* in, uint32_t* sums) {
  __shared__ uint32_t part[256];
  part[threadIdx.x] = in[blockIdx.x * 256 + threadIdx.x];
  __syncthreads();
  for (unsigned half = 128; half > 0; half /= 2) {
    if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) sums[blockIdx.x] = part[0];
}

// Each warp's sum by xor shuffles: every lane ends with it.
__global__ void WarpSums(const uint32_t* in, uint32_t* out) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  uint32_t v = in[i];
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  out[i] = v;
}

// Lane 0 leaves before the others shuffle with a mask that names it.
__global__ void ShuffleAfterALaneExits(uint32_t* out) {
  if (threadIdx.x == 0) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, threadIdx.x, 1);
}

// In each warp, half the lanes wait at __syncthreads and the other half at a shuffle that
// names the first half: neither can complete.
__global__ void BarrierAndShuffleWaitForEachOther(uint32_t* out) {
  if (threadIdx.x % 32 < 16) {
    __syncthreads();
    out[threadIdx.x] = 1;
  } else {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, threadIdx.x, 1);
  }
}

#if defined(__SANITIZE_THREAD__)
// Under TSan a block's threads are threads to it (cuda_emulation.cc): what orders them on a GPU
// orders them there, and nothing else does.

// Each thread reads its neighbour's value after a barrier (no race), or without one (a race), or
// after a warp shuffle, which orders no memory, or after __syncwarp, which does.
enum class Order { kBarrier, kNone, kShuffle, kSyncwarp };
__global__ void ReadNeighbour(const uint32_t* in, uint32_t* out, Order order) {
  __shared__ uint32_t part[64];
  part[threadIdx.x] = in[threadIdx.x];
  uint32_t lane = threadIdx.x % 32;
  if (order == Order::kBarrier) __syncthreads();
  if (order == Order::kShuffle) lane = __shfl_xor_sync(0xffffffffu, lane, 1) ^ 1u;
  if (order == Order::kSyncwarp) __syncwarp();
  out[threadIdx.x] = part[threadIdx.x - threadIdx.x % 32 + (lane + 1) % 32];
}

#endif

// Every thread counts itself into one word and a half into a float: atomically (no race under
// TSan) or not (a race). No barrier, so outside TSan its blocks' threads run as plain calls.
__global__ void CountThreads(uint32_t* count, float* halves, bool atomic) {
  if (atomic) {
    atomicAdd(count, 1u);
    atomicAdd(halves, 0.5f);
  } else {
    *count += 1;
  }
}

struct Device {
  void* ptr = nullptr;
  explicit Device(size_t bytes) { EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess); }
  ~Device() { cudaFree(ptr); }
};
struct Pinned {
  void* ptr = nullptr;
  explicit Pinned(size_t bytes) { EXPECT_EQ(cudaMallocHost(&ptr, bytes), cudaSuccess); }
  ~Pinned() { cudaFreeHost(ptr); }
};

TEST(CudaEmulation, StreamWorkRunsWhenTheHostSynchronizesNotBefore) {
  const size_t n = 1000;
  Device d(n * 4);
  Pinned in(n * 4), out(n * 4);
  for (size_t i = 0; i < n; ++i) static_cast<float*>(in.ptr)[i] = static_cast<float>(i);
  std::memset(out.ptr, 0, n * 4);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaMemcpyAsync(d.ptr, in.ptr, n * 4, cudaMemcpyHostToDevice, s));
  AddOne<<<(n + 255) / 256, 256, 0, s>>>(static_cast<float*>(d.ptr), n);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaMemcpyAsync(out.ptr, d.ptr, n * 4, cudaMemcpyDeviceToHost, s));
  // Page-locked memory is written when the stream gets there: not yet.
  EXPECT_EQ(static_cast<float*>(out.ptr)[n - 1], 0.0f);
  // The legacy stream's synchronous copy does not wait for a non-blocking stream either.
  std::vector<float> early(n, -1.0f);
  CUDA_OK(cudaMemcpy(early.data(), d.ptr, n * 4, cudaMemcpyDeviceToHost));
  EXPECT_NE(early[0], 1.0f) << "the copy on the legacy stream ran after the non-blocking stream's work";
  CUDA_OK(cudaStreamSynchronize(s));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(static_cast<float*>(out.ptr)[i], static_cast<float>(i) + 1.0f) << i;
  CUDA_OK(cudaStreamDestroy(s));
}

TEST(CudaEmulation, AStreamWaitingOnAnEventRunsTheOtherStreamsWorkFirst) {
  const size_t n = 256;
  Device d(n * 4);
  Pinned in(n * 4), out(n * 4);
  for (size_t i = 0; i < n; ++i) static_cast<float*>(in.ptr)[i] = 2.0f;
  cudaStream_t a, b;
  cudaEvent_t e;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CUDA_OK(cudaMemcpyAsync(d.ptr, in.ptr, n * 4, cudaMemcpyHostToDevice, a));
  CUDA_OK(cudaEventRecord(e, a));
  CUDA_OK(cudaStreamWaitEvent(b, e, 0));
  AddOne<<<1, 256, 0, b>>>(static_cast<float*>(d.ptr), n);
  CUDA_OK(cudaMemcpyAsync(out.ptr, d.ptr, n * 4, cudaMemcpyDeviceToHost, b));
  CUDA_OK(cudaStreamSynchronize(b));
  EXPECT_EQ(static_cast<float*>(out.ptr)[17], 3.0f);
  // A pending event answers "not ready" once, then is done.
  CUDA_OK(cudaMemcpyAsync(d.ptr, in.ptr, n * 4, cudaMemcpyHostToDevice, a));
  CUDA_OK(cudaEventRecord(e, a));
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  CUDA_OK(cudaEventDestroy(e));
  CUDA_OK(cudaStreamDestroy(a));
  CUDA_OK(cudaStreamDestroy(b));
}

TEST(CudaEmulation, BarriersAndShufflesRunInLockstep) {
  const size_t blocks = 40, n = blocks * 256;
  std::vector<uint32_t> in(n);
  std::iota(in.begin(), in.end(), 1u);
  Device d_in(n * 4), d_sums(blocks * 4), d_warps(n * 4);
  CUDA_OK(cudaMemcpy(d_in.ptr, in.data(), n * 4, cudaMemcpyHostToDevice));
  BlockSums<<<blocks, 256>>>(static_cast<const uint32_t*>(d_in.ptr), static_cast<uint32_t*>(d_sums.ptr));
  WarpSums<<<blocks, 256>>>(static_cast<const uint32_t*>(d_in.ptr), static_cast<uint32_t*>(d_warps.ptr));
  CUDA_OK(cudaGetLastError());
  std::vector<uint32_t> sums(blocks), warps(n);
  CUDA_OK(cudaMemcpy(sums.data(), d_sums.ptr, blocks * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(warps.data(), d_warps.ptr, n * 4, cudaMemcpyDeviceToHost));
  for (size_t b = 0; b < blocks; ++b) {
    ASSERT_EQ(sums[b], std::accumulate(in.begin() + b * 256, in.begin() + (b + 1) * 256, 0u)) << "block " << b;
  }
  for (size_t i = 0; i < n; ++i) {
    const size_t w = i / 32 * 32;
    ASSERT_EQ(warps[i], std::accumulate(in.begin() + w, in.begin() + w + 32, 0u)) << "thread " << i;
  }
}

TEST(CudaEmulation, AtomicAddsCountEveryThread) {
  Device count(4), halves(4);
  CUDA_OK(cudaMemset(count.ptr, 0, 4));
  CUDA_OK(cudaMemset(halves.ptr, 0, 4));
  CountThreads<<<3, 256>>>(static_cast<uint32_t*>(count.ptr), static_cast<float*>(halves.ptr), true);
  uint32_t counted = 0;
  float half_sum = 0;
  CUDA_OK(cudaMemcpy(&counted, count.ptr, 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&half_sum, halves.ptr, 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(counted, 768u);
  EXPECT_EQ(half_sum, 384.0f);
}

TEST(CudaEmulation, BadLaunchConfigurationsAreTheLastError) {
  Device d(4);
  AddOne<<<1, 2048>>>(static_cast<float*>(d.ptr), 1);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read and cleared
  AddOne<<<dim3(1, 70000), 32>>>(static_cast<float*>(d.ptr), 1);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
}

TEST(CudaEmulation, CopiesCheckTheirKindAgainstThePointers) {
  Device d(64);
  std::vector<char> host(64);
  EXPECT_EQ(cudaMemcpy(d.ptr, host.data(), 64, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d.ptr, host.data(), 65, cudaMemcpyHostToDevice), cudaErrorInvalidValue)
      << "a copy past the end of the allocation";
  cudaGetLastError();
  EXPECT_EQ(cudaMemcpy(d.ptr, host.data(), 64, cudaMemcpyHostToDevice), cudaSuccess);
}

using CudaEmulationDeathTest = ::testing::Test;

TEST_F(CudaEmulationDeathTest, TheHostTouchingDeviceMemoryFaultsNamingIt) {
  EXPECT_DEATH(
      {
        Device d(1000);
        static_cast<volatile char*>(d.ptr)[10] = 1;
      },
      "the host touched device memory");
  EXPECT_DEATH(
      {
        Device d(1000);
        AddOne<<<1, 1024>>>(static_cast<float*>(d.ptr), 1024);  // 4096 bytes: into the guard page
        cudaDeviceSynchronize();
      },
      "past the end of the 1000 bytes of device memory");
}

TEST_F(CudaEmulationDeathTest, AKernelGivenPageableHostMemoryPoisonsTheContext) {
  EXPECT_EXIT(
      {
        std::vector<float> host(256, 0.0f);
        AddOne<<<1, 256>>>(host.data(), host.size());
        const bool failed = cudaDeviceSynchronize() == cudaErrorIllegalAddress &&
                            cudaGetLastError() == cudaErrorIllegalAddress && host[0] == 0.0f;
        Device after(4);  // every later call fails too, as in a CUDA context after a fault
        std::exit(failed && after.ptr == nullptr ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "pointer argument 0 .* is neither device nor page-locked memory");
}

TEST_F(CudaEmulationDeathTest, ShufflesAndBarriersThatCannotCompleteAreNamed) {
  EXPECT_DEATH(
      {
        Device d(1024);
        ShuffleAfterALaneExits<<<1, 32>>>(static_cast<uint32_t*>(d.ptr));
        cudaDeviceSynchronize();
      },
      "kernel ShuffleAfterALaneExits: a warp shuffle's mask 0xffffffff in warp 0 of block 0 names a lane");
  EXPECT_DEATH(
      {
        Device d(1024);
        BarrierAndShuffleWaitForEachOther<<<1, 64>>>(static_cast<uint32_t*>(d.ptr));
        cudaDeviceSynchronize();
      },
      "kernel BarrierAndShuffleWaitForEachOther, block 0: its threads wait at barriers that not every live thread");
}

#if defined(__SANITIZE_THREAD__)
// Runs ReadNeighbour over 64 threads (2 warps) and checks what every thread read.
void ReadNeighbours(Order order) {
  Device in(64 * 4), out(64 * 4);
  std::vector<uint32_t> values(64), read(64);
  std::iota(values.begin(), values.end(), 100u);
  ASSERT_EQ(cudaMemcpy(in.ptr, values.data(), 256, cudaMemcpyHostToDevice), cudaSuccess);
  ReadNeighbour<<<1, 64>>>(static_cast<const uint32_t*>(in.ptr), static_cast<uint32_t*>(out.ptr), order);
  ASSERT_EQ(cudaMemcpy(read.data(), out.ptr, 256, cudaMemcpyDeviceToHost), cudaSuccess);
  for (unsigned t = 0; t < 64; ++t) EXPECT_EQ(read[t], 100 + t - t % 32 + (t % 32 + 1) % 32) << "thread " << t;
}

TEST(CudaEmulationUnderTsan, BarriersAndSyncwarpOrderABlocksThreads) {
  ReadNeighbours(Order::kBarrier);
  ReadNeighbours(Order::kSyncwarp);
}

// TSan's report fails the process whether or not it halts at the first (halt_on_error).
bool ExitedWithAnError(int status) { return WIFEXITED(status) && WEXITSTATUS(status) != 0; }

TEST_F(CudaEmulationDeathTest, ABlocksThreadsRacingAreReportedByTsan) {
  EXPECT_EXIT(
      {
        ReadNeighbours(Order::kNone);
        std::exit(0);
      },
      ExitedWithAnError, "ThreadSanitizer: data race.*ReadNeighbour");
  EXPECT_EXIT(
      {
        ReadNeighbours(Order::kShuffle);
        std::exit(0);
      },
      ExitedWithAnError, "ThreadSanitizer: data race.*ReadNeighbour");
  EXPECT_EXIT(
      {
        Device count(4);
        cudaMemset(count.ptr, 0, 4);
        CountThreads<<<1, 64>>>(static_cast<uint32_t*>(count.ptr), nullptr, false);
        cudaDeviceSynchronize();
        std::exit(0);
      },
      ExitedWithAnError, "ThreadSanitizer: data race.*CountThreads");
}
#endif

}  // namespace
