// The CUDA device (device.h): cudaMalloc'd memory (kept by its users, staging.h), page-locked host
// staging, non-blocking streams and timing-free events, and kernels that write the CPU
// kernels' bytes: the arithmetic the data path needs (casts; reduce, scale and the average's
// division for the float dtypes; float32 differences, finiteness, DGC's accumulation and
// masking; the codecs' own kernels are ops/compression/cuda's), compiled with
// --fmad=false so no multiply-add is contracted where the CPU rounds twice. Built when CMake
// finds CUDA.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "ops/common/enforce.h"
#include "ops/device/cuda_device.h"
#include "ops/device/cuda_elements.cuh"

namespace gradcomp {

namespace {

using cuda::BF16;
using cuda::F16;
using cuda::F32;

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) GC_THROW("CUDA ", what, ": ", cudaGetErrorString(e));
}

cudaStream_t Native(Stream& s) { return static_cast<cudaStream_t>(s.native()); }

// Makes `device` current for the calling thread while it lives.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    Check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) Check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// A stream of the device's own, or a framework's (torch's current stream), not owned.
class CudaStream final : public Stream {
 public:
  explicit CudaStream(int device) : owned_(true) {
    DeviceGuard guard(device);
    Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  explicit CudaStream(void* foreign) : stream_(static_cast<cudaStream_t>(foreign)), owned_(false) {}
  ~CudaStream() override {
    if (owned_) cudaStreamDestroy(stream_);
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  void Synchronize() override { Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  void* native() const override { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
  const bool owned_;
};

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(int device) {
    DeviceGuard guard(device);
    Check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  }
  ~CudaEvent() override { cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  void Record(Stream& stream) override { Check(cudaEventRecord(event_, Native(stream)), "cudaEventRecord"); }
  bool Query() override {
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    Check(e, "cudaEventQuery");
    return true;
  }
  void Synchronize() override { Check(cudaEventSynchronize(event_), "cudaEventSynchronize"); }
  void Block(Stream& stream) override { Check(cudaStreamWaitEvent(Native(stream), event_, 0), "cudaStreamWaitEvent"); }

 private:
  cudaEvent_t event_ = nullptr;
};

constexpr int kThreads = 256;

unsigned Blocks(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

#define GC_GRID_LOOP(i, n) \
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < (n); i += size_t{blockDim.x} * gridDim.x)

template <typename E>
__global__ void ReduceKernel(typename E::T* d, const typename E::T* a, const typename E::T* b, size_t n, int op) {
  GC_GRID_LOOP(i, n) {
    const float x = E::Load(a + i), y = E::Load(b + i);
    E::Store(d + i, op == 0 ? x + y : op == 1 ? x * y : op == 2 ? (y < x ? y : x) : (x < y ? y : x));
  }
}

template <typename E>
__global__ void ScaleKernel(typename E::T* b, size_t n, float f, bool divide) {
  GC_GRID_LOOP(i, n) {
    const float x = E::Load(b + i);
    E::Store(b + i, divide ? x / f : x * f);
  }
}

// Runs kernel<E> for the float dtype of the data path (float32, float16, bfloat16).
template <template <typename> class Launch, typename... Args>
void ForFloat(DataType dtype, const char* what, Args... args) {
  switch (dtype) {
    case DataType::kFloat32: return Launch<F32>::Run(args...);
    case DataType::kFloat16: return Launch<F16>::Run(args...);
    case DataType::kBFloat16: return Launch<BF16>::Run(args...);
    default:
      throw InvalidArgument(std::string("CUDA device: ") + what + " takes float32, float16 or bfloat16, not " +
                            DataTypeName(dtype));
  }
}

template <typename E>
struct LaunchReduce {
  static void Run(void* d, const void* a, const void* b, size_t n, int op, cudaStream_t s) {
    ReduceKernel<E><<<Blocks(n), kThreads, 0, s>>>(static_cast<typename E::T*>(d),
                                                   static_cast<const typename E::T*>(a),
                                                   static_cast<const typename E::T*>(b), n, op);
  }
};

template <typename E>
struct LaunchScale {
  static void Run(void* b, size_t n, float f, bool divide, cudaStream_t s) {
    ScaleKernel<E><<<Blocks(n), kThreads, 0, s>>>(static_cast<typename E::T*>(b), n, f, divide);
  }
};

__global__ void SubtractKernel(float* d, const float* a, const float* b, size_t n) {
  GC_GRID_LOOP(i, n) { d[i] = a[i] - b[i]; }
}

__global__ void NonFiniteKernel(const float* b, size_t n, int* any) {
  GC_GRID_LOOP(i, n) {
    if ((__float_as_uint(b[i]) & 0x7f800000u) == 0x7f800000u) *any = 1;
  }
}

__global__ void DgcKernel(float* u, float* v, float* g, size_t n, float m, bool nesterov) {
  GC_GRID_LOOP(i, n) {
    if (nesterov) {
      u[i] = (u[i] + g[i]) * m;
      v[i] = (v[i] + u[i]) + g[i];
    } else {
      u[i] = m * u[i] + g[i];
      v[i] = v[i] + u[i];
    }
    g[i] = v[i];
  }
}

__global__ void ZeroAtKernel(float* b, const uint32_t* idx, size_t count) {
  GC_GRID_LOOP(j, count) { b[idx[j]] = 0.0f; }
}

class Cuda final : public Device {
 public:
  explicit Cuda(int ordinal) : ordinal_(ordinal), name_("cuda:" + std::to_string(ordinal)) {}
  ~Cuda() override {
    if (flag_ != nullptr) cudaFree(flag_);
    if (indices_ != nullptr) cudaFree(indices_);
  }
  Cuda(const Cuda&) = delete;
  Cuda& operator=(const Cuda&) = delete;

  const char* name() const override { return name_.c_str(); }
  MemorySpace space() const override { return MemorySpace::kDevice; }
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  void* HostAddress(const void*, size_t, const char* what) const override {
    throw InvalidArgument(name_ + ": " + what + " is GPU memory, which the CPU cannot address");
  }
  int ordinal() const { return ordinal_; }

  void* Allocate(size_t bytes) override {
    ++allocations_;
    DeviceGuard guard(ordinal_);
    void* p = nullptr;
    Check(cudaMalloc(&p, bytes > 0 ? bytes : 1), "cudaMalloc");
    return p;
  }
  void Free(void* ptr, size_t) override { cudaFree(ptr); }
  void* AllocateHost(size_t bytes) override {
    ++allocations_;
    void* p = nullptr;
    Check(cudaMallocHost(&p, bytes > 0 ? bytes : 1), "cudaMallocHost");
    return p;
  }
  void FreeHost(void* ptr, size_t) override { cudaFreeHost(ptr); }
  std::unique_ptr<Stream> NewStream() override { return std::make_unique<CudaStream>(ordinal_); }
  std::unique_ptr<Event> NewEvent() override { return std::make_unique<CudaEvent>(ordinal_); }

  void CopyToHost(void* host_dst, const void* src, size_t bytes, Stream& s) override {
    if (bytes > 0) Check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, Native(s)), "copy to host");
  }
  void CopyFromHost(void* dst, const void* host_src, size_t bytes, Stream& s) override {
    if (bytes > 0) Check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, Native(s)), "copy from host");
  }
  void Copy(void* dst, const void* src, size_t bytes, Stream& s) override {
    if (bytes > 0 && dst != src) {
      Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, Native(s)), "device copy");
    }
  }
  void Fill(void* dst, uint8_t value, size_t bytes, Stream& s) override {
    if (bytes > 0) Check(cudaMemsetAsync(dst, value, bytes, Native(s)), "fill");
  }

  void Cast(const void* in, DataType in_dtype, size_t n, void* out, DataType out_dtype, bool accumulate,
            Stream& s) override {
    if (n == 0) return;
    if (in_dtype == out_dtype && !accumulate) return Copy(out, in, n * DataTypeSize(in_dtype), s);
    cuda::Cast(in, in_dtype, n, out, out_dtype, accumulate, s.native());
  }
  bool Arithmetic(DataType dtype) const override { return IsFloat32Or16(dtype); }
  void Reduce(void* dst, const void* a, const void* b, size_t n, DataType dtype, ReduceOp op, Stream& s) override {
    int code = 0;
    switch (op) {
      case ReduceOp::kSum: code = 0; break;
      case ReduceOp::kProduct: code = 1; break;
      case ReduceOp::kMin: code = 2; break;
      case ReduceOp::kMax: code = 3; break;
      default: throw InvalidArgument(std::string("CUDA device: Reduce does not take op ") + ReduceOpName(op));
    }
    ForFloat<LaunchReduce>(dtype, "Reduce", dst, a, b, n, code, Native(s));
    if (n > 0) cuda::CheckLaunch("Reduce");
  }
  void Scale(void* buf, size_t n, DataType dtype, double factor, Stream& s) override {
    if (factor == 1.0) return;  // nothing to do, whatever the dtype (as the CPU's)
    ForFloat<LaunchScale>(dtype, "Scale", buf, n, static_cast<float>(factor), false, Native(s));
    if (n > 0) cuda::CheckLaunch("Scale");
  }
  void FinishReduction(void* buf, size_t n, DataType dtype, ReduceOp op, double postscale, int ranks,
                       Stream& s) override {
    if (op == ReduceOp::kAverage && ranks != 1) {  // a true division, as the CPU's
      ForFloat<LaunchScale>(dtype, "FinishReduction", buf, n, static_cast<float>(ranks), true, Native(s));
      if (n > 0) cuda::CheckLaunch("FinishReduction");
    }
    Scale(buf, n, dtype, postscale, s);
  }
  void Subtract(float* dst, const float* a, const float* b, size_t n, Stream& s) override {
    if (n == 0) return;
    SubtractKernel<<<Blocks(n), kThreads, 0, Native(s)>>>(dst, a, b, n);
    cuda::CheckLaunch("Subtract");
  }
  bool AllFinite(const float* buf, size_t n, Stream& s) override {
    if (n == 0) return true;
    std::lock_guard<std::mutex> lock(mu_);
    if (flag_ == nullptr) flag_ = static_cast<int*>(Allocate(sizeof(int)));
    Check(cudaMemsetAsync(flag_, 0, sizeof(int), Native(s)), "fill");
    NonFiniteKernel<<<Blocks(n), kThreads, 0, Native(s)>>>(buf, n, flag_);
    cuda::CheckLaunch("AllFinite");
    int any = 0;
    CopyToHost(&any, flag_, sizeof(int), s);
    s.Synchronize();
    return any == 0;
  }
  void DgcAccumulate(float* u, float* v, float* grad, size_t n, float momentum, bool nesterov, Stream& s) override {
    if (n == 0) return;
    DgcKernel<<<Blocks(n), kThreads, 0, Native(s)>>>(u, v, grad, n, momentum, nesterov);
    cuda::CheckLaunch("DgcAccumulate");
  }
  void ZeroAt(float* buf, size_t n, const uint32_t* host_indices, size_t count, Stream& s) override {
    if (count == 0) return;
    for (size_t j = 0; j < count; ++j) {
      GC_ENFORCE(host_indices[j] < n, "ZeroAt: index ", host_indices[j], " outside ", n, " values");
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (indices_capacity_ < count) {
      // Sent counts vary from step to step and tensor to tensor (a threshold picks them): room
      // for twice this one, so that steady steps do not allocate (cudaFree stalls the device).
      if (indices_ != nullptr) cudaFree(indices_);
      indices_capacity_ = std::max(2 * count, 2 * indices_capacity_);
      indices_ = static_cast<uint32_t*>(Allocate(indices_capacity_ * sizeof(uint32_t)));
    }
    CopyFromHost(indices_, host_indices, count * sizeof(uint32_t), s);
    ZeroAtKernel<<<Blocks(count), kThreads, 0, Native(s)>>>(buf, indices_, count);
    cuda::CheckLaunch("ZeroAt");
    s.Synchronize();  // the host indices may go away, and indices_ is reused
  }

 private:
  const int ordinal_;
  const std::string name_;
  std::mutex mu_;
  int* flag_ = nullptr;  // AllFinite's answer
  uint32_t* indices_ = nullptr;
  size_t indices_capacity_ = 0;
};

// ---- casts -----------------------------------------------------------------------------------

template <typename Src, typename Dst>
__global__ void CastKernel(const typename Src::T* in, size_t n, typename Dst::T* out, bool accumulate) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = Src::Load(in + i);
  if (accumulate) v = __fadd_rn(Dst::Load(out + i), v);
  Dst::Store(out + i, v);
}

template <typename Src>
void CastFrom(const void* in, size_t n, void* out, DataType out_dtype, bool accumulate, cudaStream_t s) {
  const auto* src = static_cast<const typename Src::T*>(in);
  const unsigned blocks = Blocks(n);
  switch (out_dtype) {
    case DataType::kFloat16:
      CastKernel<Src, F16><<<blocks, kThreads, 0, s>>>(src, n, static_cast<uint16_t*>(out), accumulate);
      break;
    case DataType::kBFloat16:
      CastKernel<Src, BF16><<<blocks, kThreads, 0, s>>>(src, n, static_cast<uint16_t*>(out), accumulate);
      break;
    default:
      CastKernel<Src, F32><<<blocks, kThreads, 0, s>>>(src, n, static_cast<float*>(out), accumulate);
  }
}

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

Device& CudaDevice(int ordinal) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<Cuda>> devices;
  std::lock_guard<std::mutex> lock(mu);
  const int count = CudaDeviceCount();
  if (ordinal < 0 || ordinal >= count) {
    throw InvalidArgument("CUDA device " + std::to_string(ordinal) + " does not exist (this process sees " +
                          std::to_string(count) + ")");
  }
  std::unique_ptr<Cuda>& d = devices[ordinal];
  if (!d) d = std::make_unique<Cuda>(ordinal);
  return *d;
}

int CudaOrdinal(const Device& device) {
  const auto* cuda = dynamic_cast<const Cuda*>(&device);
  return cuda != nullptr ? cuda->ordinal() : -1;
}

std::unique_ptr<Stream> WrapCudaStream(void* stream) { return std::make_unique<CudaStream>(stream); }

namespace cuda {

void RequireFloat(DataType dt, const char* what) {
  if (!IsFloat32Or16(dt)) {
    throw InvalidArgument(std::string(what) + ": dtype " + DataTypeName(dt) +
                          " is not supported on the GPU (float32, float16, bfloat16)");
  }
}

void CheckLaunch(const std::string& what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw Error("CUDA " + what + " failed: " + cudaGetErrorString(err));
}

void Cast(const void* in, DataType in_dtype, size_t n, void* out, DataType out_dtype, bool accumulate, void* stream) {
  RequireFloat(in_dtype, "cast");
  RequireFloat(out_dtype, "cast");
  if (n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (in_dtype) {
    case DataType::kFloat16: CastFrom<F16>(in, n, out, out_dtype, accumulate, s); break;
    case DataType::kBFloat16: CastFrom<BF16>(in, n, out, out_dtype, accumulate, s); break;
    default: CastFrom<F32>(in, n, out, out_dtype, accumulate, s);
  }
  CheckLaunch("cast");
}

}  // namespace cuda

}  // namespace gradcomp
