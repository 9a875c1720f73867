// topk on a CUDA device (codec_cuda.h): the CPU codec's selection and wire, computed where the
// values are. The threshold search is the CPU's own (SearchTopKThreshold): the strided sample
// is gathered on the device and its k-th largest taken on the host (a sample is small), the
// counts above a threshold are exact device counts, so the threshold, the adjustments and the
// kept indices are the CPU's. The kept indices are compacted in ascending order (per block of
// values, offsets from a host scan of the block counts). The rare exact top-k fallback runs
// the CPU selection on a host copy of the values.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ops/common/enforce.h"
#include "ops/compression/codec_on_device.h"
#include "ops/compression/cuda/codec_cuda.h"
#include "ops/compression/topk.h"
#include "ops/device/cuda_device.h"
#include "ops/device/cuda_elements.cuh"

namespace gradcomp::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 4;
constexpr size_t kBlockValues = size_t{kThreads} * kPerThread;  // values per compaction block

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) GC_THROW("CUDA topk ", what, ": ", cudaGetErrorString(e));
}

unsigned Grid(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(b, 65535)));
}

// Device scratch of the calling thread, per GPU: importances, block counts and offsets, flags.
struct Scratch {
  float* importance = nullptr;
  size_t importance_cap = 0;
  uint32_t* blocks = nullptr;  // counts, then offsets
  size_t blocks_cap = 0;
  float* samples = nullptr;
  size_t samples_cap = 0;
  unsigned long long* counter = nullptr;

  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    cudaFree(importance);
    cudaFree(blocks);
    cudaFree(samples);
    cudaFree(counter);
  }

  template <typename T>
  static T* Grow(T* p, size_t* cap, size_t want) {
    if (*cap >= want) return p;
    if (p != nullptr) cudaFree(p);
    void* q = nullptr;
    Check(cudaMalloc(&q, std::max<size_t>(want, 1) * sizeof(T)), "cudaMalloc");
    *cap = want;
    return static_cast<T*>(q);
  }
};

Scratch& ScratchHere() {
  thread_local std::map<int, std::unique_ptr<Scratch>> per_device;
  int device = 0;
  Check(cudaGetDevice(&device), "cudaGetDevice");
  std::unique_ptr<Scratch>& s = per_device[device];
  if (!s) {
    s = std::make_unique<Scratch>();
    Check(cudaMalloc(&s->counter, sizeof(unsigned long long)), "cudaMalloc");
  }
  return *s;
}

template <typename E>
__global__ void ImportanceKernel(const typename E::T* in, size_t n, float* imp) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{blockDim.x} * gridDim.x) {
    const float x = E::Load(in + i);
    imp[i] = isnan(x) ? INFINITY : fabsf(x);
  }
}

__global__ void SampleKernel(const float* imp, size_t start, size_t stride, size_t m, float* out) {
  for (size_t j = blockIdx.x * size_t{blockDim.x} + threadIdx.x; j < m; j += size_t{blockDim.x} * gridDim.x) {
    out[j] = imp[start + j * stride];
  }
}

__global__ void CountKernel(const float* imp, size_t n, float t, unsigned long long* count) {
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{blockDim.x} * gridDim.x) {
    mine += imp[i] >= t;
  }
  if (mine > 0) atomicAdd(count, mine);
}

// Block b of kBlockValues values: counts[b] = values >= t in it.
__global__ void BlockCountKernel(const float* imp, size_t n, float t, uint32_t* counts) {
  __shared__ uint32_t total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  const size_t base = blockIdx.x * kBlockValues + threadIdx.x * size_t{kPerThread};
  uint32_t mine = 0;
  for (int q = 0; q < kPerThread; ++q) mine += base + q < n && imp[base + q] >= t;
  if (mine > 0) atomicAdd(&total, mine);
  __syncthreads();
  if (threadIdx.x == 0) counts[blockIdx.x] = total;
}

// Writes the indices of block b's values >= t at offsets[b] onwards, in ascending order: each
// thread owns kPerThread consecutive values; a scan of the threads' counts orders them.
__global__ void CompactKernel(const float* imp, size_t n, float t, const uint32_t* offsets, uint32_t* indices) {
  __shared__ uint32_t scan[kThreads];
  const size_t base = blockIdx.x * kBlockValues + threadIdx.x * size_t{kPerThread};
  uint32_t mine = 0;
  for (int q = 0; q < kPerThread; ++q) mine += base + q < n && imp[base + q] >= t;
  scan[threadIdx.x] = mine;
  __syncthreads();
  for (int d = 1; d < kThreads; d *= 2) {  // inclusive scan (Hillis-Steele)
    const uint32_t add = threadIdx.x >= static_cast<unsigned>(d) ? scan[threadIdx.x - d] : 0;
    __syncthreads();
    scan[threadIdx.x] += add;
    __syncthreads();
  }
  uint32_t at = offsets[blockIdx.x] + scan[threadIdx.x] - mine;
  for (int q = 0; q < kPerThread; ++q) {
    if (base + q < n && imp[base + q] >= t) indices[at++] = static_cast<uint32_t>(base + q);
  }
}

template <typename E>
__global__ void GatherKernel(const typename E::T* in, const uint32_t* indices, size_t count, DataType value_dtype,
                             uint8_t* values) {
  for (size_t j = blockIdx.x * size_t{blockDim.x} + threadIdx.x; j < count; j += size_t{blockDim.x} * gridDim.x) {
    const float v = E::Load(in + indices[j]);
    if (value_dtype == DataType::kFloat16) {
      F16::Store(reinterpret_cast<uint16_t*>(values) + j, v);
    } else {
      F32::Store(reinterpret_cast<float*>(values) + j, v);
    }
  }
}

// Sets *bad when an index is outside n.
__global__ void CheckIndicesKernel(const uint32_t* indices, size_t count, size_t n, int* bad) {
  for (size_t j = blockIdx.x * size_t{blockDim.x} + threadIdx.x; j < count; j += size_t{blockDim.x} * gridDim.x) {
    if (indices[j] >= n) *bad = 1;
  }
}

template <typename E>
__global__ void ScatterKernel(const uint32_t* indices, const uint8_t* values, size_t count, DataType value_dtype,
                              typename E::T* out) {
  for (size_t j = blockIdx.x * size_t{blockDim.x} + threadIdx.x; j < count; j += size_t{blockDim.x} * gridDim.x) {
    const float v = value_dtype == DataType::kFloat16 ? F16::Load(reinterpret_cast<const uint16_t*>(values) + j)
                                                      : F32::Load(reinterpret_cast<const float*>(values) + j);
    typename E::T* o = out + indices[j];
    E::Store(o, E::Load(o) + v);
  }
}

// Runs f(E{}) for the element type E of `dtype`.
template <typename F>
void ForElement(DataType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DataType::kFloat32: return f(F32{});
    case DataType::kFloat16: return f(F16{});
    case DataType::kBFloat16: return f(BF16{});
    default:
      throw InvalidArgument(std::string("topk: ") + what + " dtype " + DataTypeName(dtype) +
                            " is not float32, float16 or bfloat16");
  }
}

cudaStream_t S(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace

size_t TopKEncode(const void* in, DataType dtype, size_t n, const CodecParams& p, uint64_t first_index, uint8_t* out,
                  void* stream) {
  const Codec& codec = TopKCodec();
  codec.Validate(p);
  if (n > static_cast<size_t>(INT32_MAX)) {
    throw InvalidArgument("topk: a segment of " + std::to_string(n) + " values exceeds int32 indices");
  }
  const cudaStream_t s = S(stream);
  const size_t vsize = DataTypeSize(p.topk_value_dtype), esize = DataTypeSize(dtype);
  Scratch& sc = ScratchHere();
  uint32_t count = 0;
  std::vector<uint32_t> exact_indices;
  TopKSelection sel;
  if (TopKTarget(n, p.topk_ratio) > 0) {
    sc.importance = Scratch::Grow(sc.importance, &sc.importance_cap, n);
    ForElement(dtype, "input", [&](auto element) {
      using E = decltype(element);
      ImportanceKernel<E><<<Grid(n), kThreads, 0, s>>>(static_cast<const typename E::T*>(in), n, sc.importance);
    });
    CheckLaunch("topk importance");
    sel = SearchTopKThreshold(
        n, p, first_index,
        [&](size_t start, size_t stride) {
          const size_t m = start < n ? (n - start + stride - 1) / stride : 0;
          std::vector<float> host(m);
          sc.samples = Scratch::Grow(sc.samples, &sc.samples_cap, m);
          SampleKernel<<<Grid(m), kThreads, 0, s>>>(sc.importance, start, stride, m, sc.samples);
          Check(cudaMemcpyAsync(host.data(), sc.samples, m * sizeof(float), cudaMemcpyDeviceToHost, s), "sample");
          Check(cudaStreamSynchronize(s), "sample");
          return host;
        },
        [&](float t) {
          unsigned long long c = 0;
          Check(cudaMemsetAsync(sc.counter, 0, sizeof c, s), "count");
          CountKernel<<<Grid(n), kThreads, 0, s>>>(sc.importance, n, t, sc.counter);
          Check(cudaMemcpyAsync(&c, sc.counter, sizeof c, cudaMemcpyDeviceToHost, s), "count");
          Check(cudaStreamSynchronize(s), "count");
          return static_cast<size_t>(c);
        });
    if (sel.exact) {  // rare: the CPU's exact selection on a host copy
      std::vector<uint8_t> host(n * esize);
      Check(cudaMemcpyAsync(host.data(), in, host.size(), cudaMemcpyDeviceToHost, s), "exact copy");
      Check(cudaStreamSynchronize(s), "exact copy");
      exact_indices = SelectTopK(host.data(), dtype, n, p, first_index).indices;
      count = static_cast<uint32_t>(exact_indices.size());
      if (count > 0) {
        Check(cudaMemcpyAsync(out + 4, exact_indices.data(), 4 * size_t{count}, cudaMemcpyHostToDevice, s), "indices");
      }
    } else {
      const size_t blocks = (n + kBlockValues - 1) / kBlockValues;
      sc.blocks = Scratch::Grow(sc.blocks, &sc.blocks_cap, blocks);
      BlockCountKernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(sc.importance, n, sel.threshold, sc.blocks);
      std::vector<uint32_t> offsets(blocks);
      Check(cudaMemcpyAsync(offsets.data(), sc.blocks, blocks * 4, cudaMemcpyDeviceToHost, s), "block counts");
      Check(cudaStreamSynchronize(s), "block counts");
      for (size_t b = 0; b < blocks; ++b) {  // exclusive scan
        const uint32_t c = offsets[b];
        offsets[b] = count;
        count += c;
      }
      Check(cudaMemcpyAsync(sc.blocks, offsets.data(), blocks * 4, cudaMemcpyHostToDevice, s), "block offsets");
      CompactKernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(sc.importance, n, sel.threshold, sc.blocks,
                                                                       reinterpret_cast<uint32_t*>(out + 4));
      Check(cudaStreamSynchronize(s), "compaction");  // `offsets` is freed on return
    }
    CheckLaunch("topk selection");
    if (count > 0) {
      uint8_t* values = out + 4 + 4 * size_t{count};
      ForElement(dtype, "input", [&](auto element) {
      using E = decltype(element);
        GatherKernel<E><<<Grid(count), kThreads, 0, s>>>(static_cast<const typename E::T*>(in),
                                                        reinterpret_cast<const uint32_t*>(out + 4), count,
                                                        p.topk_value_dtype, values);
      });
      CheckLaunch("topk values");
    }
  }
  Check(cudaMemcpyAsync(out, &count, 4, cudaMemcpyHostToDevice, s), "header");
  Check(cudaStreamSynchronize(s), "header");  // the size is for the host, `count` is local
  return 4 + size_t{count} * (4 + vsize);
}

void TopKDecode(const uint8_t* wire, size_t wire_bytes, size_t n, const CodecParams& p, DataType out_dtype,
                void* out, bool accumulate, void* stream) {
  const cudaStream_t s = S(stream);
  const size_t vsize = DataTypeSize(p.topk_value_dtype);
  if (wire_bytes < 4) throw InvalidArgument("topk: encoded segment of " + std::to_string(wire_bytes) + " bytes has no header");
  uint32_t count = 0;
  Check(cudaMemcpyAsync(&count, wire, 4, cudaMemcpyDeviceToHost, s), "header");
  Check(cudaStreamSynchronize(s), "header");
  if (wire_bytes != 4 + size_t{count} * (4 + vsize) || count > n) {
    throw InvalidArgument("topk: encoded segment of " + std::to_string(wire_bytes) + " bytes does not hold " +
                          std::to_string(count) + " values of a " + std::to_string(n) + "-value tensor");
  }
  const auto* indices = reinterpret_cast<const uint32_t*>(wire + 4);
  const uint8_t* values = wire + 4 + 4 * size_t{count};
  if (count > 0) {  // a peer's indices are checked before anything is written
    Scratch& sc = ScratchHere();
    int bad = 0;
    Check(cudaMemsetAsync(sc.counter, 0, sizeof(int), s), "check");
    CheckIndicesKernel<<<Grid(count), kThreads, 0, s>>>(indices, count, n, reinterpret_cast<int*>(sc.counter));
    Check(cudaMemcpyAsync(&bad, sc.counter, sizeof bad, cudaMemcpyDeviceToHost, s), "check");
    Check(cudaStreamSynchronize(s), "check");
    if (bad) throw InvalidArgument("topk: an index is outside a " + std::to_string(n) + "-value tensor");
  }
  ForElement(out_dtype, "output", [&](auto element) {
      using E = decltype(element);
    if (!accumulate && n > 0) Check(cudaMemsetAsync(out, 0, n * sizeof(typename E::T), s), "zero");
    if (count > 0) {
      ScatterKernel<E><<<Grid(count), kThreads, 0, s>>>(indices, values, count, p.topk_value_dtype,
                                                       static_cast<typename E::T*>(out));
    }
  });
  CheckLaunch("topk scatter");
}

}  // namespace gradcomp::cuda

namespace gradcomp {

namespace {

size_t TopKEncodeOn(Device&, const Codec&, const void* in, DataType dtype, size_t n, const CodecParams& p,
                    uint64_t first_index, void* out, Stream& stream) {
  return cuda::TopKEncode(in, dtype, n, p, first_index, static_cast<uint8_t*>(out), stream.native());
}

void TopKDecodeOn(Device&, const Codec&, const void* wire, size_t wire_bytes, size_t n, const CodecParams& p,
                  DataType out_dtype, void* out, bool accumulate, Stream& stream) {
  cuda::TopKDecode(static_cast<const uint8_t*>(wire), wire_bytes, n, p, out_dtype, out, accumulate, stream.native());
}

}  // namespace

const DeviceCodecKernels* TopKCudaKernels() {
  static const DeviceCodecKernels kernels{TopKEncodeOn, TopKDecodeOn};
  return &kernels;
}

}  // namespace gradcomp
