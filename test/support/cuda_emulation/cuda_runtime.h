// An emulated CUDA runtime for CI machines without a GPU: the CUDA sources of ops/ (kernels
// included) compiled as host C++ against this header instead of the toolkit's, so the GPU tests
// (test_cuda_codecs, test_cuda_device, the compressed collectives on a CUDA device) run on a CPU.
// cmake/EmulateCuda.cmake rewrites each launch `K<<<cfg>>>(args)` into
// `::gc_cuda_emulation::Launcher(K, "K", ::gc_cuda_emulation::Config(cfg))(args)`; nothing else
// of the sources changes.
//
// What it checks that a plain host build would not (cuda_emulation.cc):
//  - streams run their work only when the host synchronizes (a stream, an event, the device, a
//    copy into pageable memory) or waits on an event, never earlier, so a host read of pinned
//    memory or of a copy's result before the synchronization CUDA requires sees stale bytes, as
//    it may on a GPU; non-blocking streams do not synchronize with the legacy stream;
//  - device memory is closed to the host (touching it faults, with a message) except while
//    stream work that names it runs (a kernel's pointer arguments, a copy's or fill's buffers),
//    has a guard page after it, and starts as 0xff bytes;
//  - a kernel's pointer arguments must be page-locked memory or its own GPU's (of
//    GRADCOMP_CUDA_EMULATION_DEVICES, 8 unless set; else the context gets CUDA's sticky
//    illegal-address error); launch configurations are checked as CUDA does;
//  - __syncthreads and warp shuffles run the block's threads as fibers, in lockstep at each
//    barrier; a lane that exits before a shuffle its mask names, or a barrier not every live
//    thread reaches, is a fatal error.
//  - under TSan (scripts/test.sh --sanitize thread), a block's threads are threads to TSan, ordered
//    only by the block's start and end, __syncthreads and __syncwarp (not by shuffles, which order
//    no memory on a GPU), so races between them are reported (compute-sanitizer's racecheck,
//    within a block; between blocks only across thread indices, in kernels without __syncthreads,
//    whose blocks run in order) and atomicAdd is a relaxed atomic.
// It measures nothing: that is for a GPU.
#pragma once

#include <math.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// One copy per host thread: a block's fibers share it, blocks run one after another.
#define __shared__ static thread_local

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
using uint3 = dim3;

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorNotSupported = 801,
};
using cudaError = cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;

constexpr unsigned cudaStreamDefault = 0x0;
constexpr unsigned cudaStreamNonBlocking = 0x1;
constexpr unsigned cudaEventDefault = 0x0;
constexpr unsigned cudaEventDisableTiming = 0x2;

// ---- host API (C++ linkage: never confused with a real libcudart) ------------------------------

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);

cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocHost(void** ptr, size_t bytes);
cudaError_t cudaFreeHost(void* ptr);
template <typename T>
cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
template <typename T>
cudaError_t cudaMallocHost(T** ptr, size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(ptr), bytes);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream = nullptr);

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);

// ---- device functions -------------------------------------------------------------------------

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline int __float_as_int(float f) { return static_cast<int>(__float_as_uint(f)); }
inline float __int_as_float(int i) { return __uint_as_float(static_cast<unsigned>(i)); }

// An atomic read-modify-write with no ordering, as a GPU's: under TSan, which sees a block's
// threads as concurrent, it is no race with another atomic and orders nothing else.
template <typename T>
T atomicAdd(T* address, T value) {
  static_assert(std::is_arithmetic_v<T>, "atomicAdd: an arithmetic type");
  if constexpr (std::is_integral_v<T>) {
    return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
  } else {
    T seen;
    __atomic_load(address, &seen, __ATOMIC_RELAXED);
    for (;;) {
      T sum = static_cast<T>(seen + value);
      if (__atomic_compare_exchange(address, &seen, &sum, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return seen;
    }
  }
}

void __syncthreads();
void __syncwarp(unsigned mask = 0xffffffffu);

namespace gc_cuda_emulation {

enum class Shuffle { kIndex, kXor, kDown, kUp };
/// The warp exchange behind the __shfl_*_sync functions: the `value` of the lane the shuffle names
/// (the caller's own when that lane is outside its segment of `width`).
uint64_t WarpShuffle(unsigned mask, Shuffle how, int arg, int width, uint64_t value);

template <typename T>
T Shuffled(unsigned mask, T v, Shuffle how, int arg, int width) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "warp shuffles take up to 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = WarpShuffle(mask, how, arg, width, bits);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

}  // namespace gc_cuda_emulation

template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  return gc_cuda_emulation::Shuffled(mask, v, gc_cuda_emulation::Shuffle::kIndex, src_lane, width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return gc_cuda_emulation::Shuffled(mask, v, gc_cuda_emulation::Shuffle::kXor, lane_mask, width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return gc_cuda_emulation::Shuffled(mask, v, gc_cuda_emulation::Shuffle::kDown, static_cast<int>(delta), width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return gc_cuda_emulation::Shuffled(mask, v, gc_cuda_emulation::Shuffle::kUp, static_cast<int>(delta), width);
}

// ---- launches ---------------------------------------------------------------------------------

namespace gc_cuda_emulation {

/// A launch's <<<grid, block, shared bytes, stream>>>.
struct Config {
  Config(dim3 g, dim3 b, size_t shared = 0, cudaStream_t s = nullptr)
      : grid(g), block(b), shared_bytes(shared), stream(s) {}
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;
};

/// Enqueues a grid on c.stream: `thread` runs one thread of the kernel (threadIdx and blockIdx
/// set); `pointers` are its pointer arguments, checked when it runs. Sets the last error as CUDA
/// does for a bad configuration.
void Enqueue(const char* name, const void* kernel, const Config& c, std::vector<const void*> pointers,
             std::function<void()> thread);

template <typename... P>
class Launcher {
 public:
  Launcher(void (*kernel)(P...), const char* name, Config c) : kernel_(kernel), name_(name), config_(c) {}

  template <typename... A>
  void operator()(A&&... a) const {
    static_assert(sizeof...(A) == sizeof...(P), "a kernel launch with the wrong number of arguments");
    // Arguments are copied at the launch, as CUDA copies them.
    auto args = std::make_shared<std::tuple<std::decay_t<P>...>>(std::forward<A>(a)...);
    std::vector<const void*> pointers;
    std::apply([&](const auto&... x) { (Collect(x, &pointers), ...); }, *args);
    void (*k)(P...) = kernel_;
    Enqueue(name_, reinterpret_cast<const void*>(kernel_), config_, std::move(pointers),
            [k, args] { std::apply(k, *args); });
  }

 private:
  template <typename X>
  static void Collect(const X& x, std::vector<const void*>* out) {
    if constexpr (std::is_pointer_v<X>) out->push_back(reinterpret_cast<const void*>(x));
  }

  void (*kernel_)(P...);
  const char* name_;
  Config config_;
};
template <typename... P>
Launcher(void (*)(P...), const char*, Config) -> Launcher<P...>;

}  // namespace gc_cuda_emulation
