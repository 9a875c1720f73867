// The device layer the data path is written against: where a buffer lives, allocation, copies
// between memory spaces, an ordered stream with events, and the element-wise kernels the
// collectives need (casts, reduce, scale, the final division of an average, residual
// differences, finiteness checks, DGC's momentum). Codecs bring their own kernels for each kind
// of device (ops/compression/codec_on_device.h). Implementations:
//   - the host (HostDevice): buffers are host memory, every call runs at once on the calling
//     thread, with the CPU kernels of ops/reduce: today's path, no copies;
//   - a separate-memory host device for tests (NewSeparateMemoryDevice): its buffers are host
//     memory behind pointers that are not host addresses, so host code that touches one
//     directly faults, and a host pointer passed where a device one belongs (or the reverse)
//     is an error naming the call. CI runs the data path through it to catch every missing
//     copy and every wrong-space access without a GPU;
//   - CUDA (built with the toolkit), whose kernels write the CPU's bytes.
// Calls take a Stream: work is ordered within a stream; Events order streams and the host.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "ops/common/dtype.h"

namespace gradcomp {

/// Where a buffer's bytes are: host memory, or a device's own memory.
enum class MemorySpace : uint8_t { kHost = 0, kDevice = 1 };
/// What runs a device's kernels (a codec's registry entry names its kernels for each kind).
enum class DeviceKind : uint8_t { kCpu = 0, kCuda = 1 };

/// An ordered queue of a device's work. Host devices run each call when it is made, so their
/// streams are always idle.
class Stream {
 public:
  virtual ~Stream() = default;
  /// Waits until every call queued so far has run.
  virtual void Synchronize() = 0;
  /// The device's own handle (a cudaStream_t), or null.
  virtual void* native() const { return nullptr; }
};

/// A point in a stream's work: recorded on a stream, then waited for by the host or by another
/// stream.
class Event {
 public:
  virtual ~Event() = default;
  /// Marks the current end of `stream`'s work.
  virtual void Record(Stream& stream) = 0;
  /// True once the recorded work has run; never blocks.
  virtual bool Query() = 0;
  /// Blocks the calling thread until the recorded work has run.
  virtual void Synchronize() = 0;
  /// Makes `stream` wait for the recorded work without blocking the host.
  virtual void Block(Stream& stream) = 0;
};

/// A device: its memory and the kernels that run on it. Every buffer argument of a kernel
/// lives in this device's memory space unless its name says host. Thread-safe.
class Device {
 public:
  virtual ~Device() = default;
  /// "host", "separate-memory host (tests)", "cuda:0", ...
  virtual const char* name() const = 0;
  virtual MemorySpace space() const = 0;
  virtual DeviceKind kind() const = 0;
  /// A kCpu device's buffer as a CPU address: `bytes` bytes at this device's pointer `ptr`
  /// (InvalidArgument naming `what` when they are not its memory). Other kinds: InvalidArgument.
  virtual void* HostAddress(const void* ptr, size_t bytes, const char* what) const = 0;

  /// Raw memory of at least `bytes` bytes, aligned to 256. The data path keeps what it
  /// allocates (staging.h's Scratch) so that once sizes stop growing it allocates nothing.
  /// `bytes` == 0 gives a valid, unusable pointer.
  virtual void* Allocate(size_t bytes) = 0;
  /// Returns what Allocate(bytes) gave.
  virtual void Free(void* ptr, size_t bytes) = 0;
  /// Host memory for staging this device's bytes on their way to the network (page-locked for
  /// a GPU, so copies run asynchronously at full speed; plain memory for the host devices).
  virtual void* AllocateHost(size_t bytes) = 0;
  virtual void FreeHost(void* ptr, size_t bytes) = 0;
  virtual std::unique_ptr<Stream> NewStream() = 0;
  virtual std::unique_ptr<Event> NewEvent() = 0;
  /// Allocate and AllocateHost calls so far (tests check that steady steps make none).
  uint64_t allocations() const { return allocations_.load(); }

  /// host_dst[0, bytes) = src[0, bytes).
  virtual void CopyToHost(void* host_dst, const void* src, size_t bytes, Stream& stream) = 0;
  /// dst[0, bytes) = host_src[0, bytes).
  virtual void CopyFromHost(void* dst, const void* host_src, size_t bytes, Stream& stream) = 0;
  /// dst[0, bytes) = src[0, bytes), both on this device (they may not overlap unless equal).
  virtual void Copy(void* dst, const void* src, size_t bytes, Stream& stream) = 0;
  /// Every byte of dst[0, bytes) = `value`.
  virtual void Fill(void* dst, uint8_t value, size_t bytes, Stream& stream) = 0;

  /// out = in converted between float32 / float16 / bfloat16 (out += in with `accumulate`).
  virtual void Cast(const void* in, DataType in_dtype, size_t n, void* out, DataType out_dtype, bool accumulate,
                    Stream& stream) = 0;
  /// Whether Reduce, Scale and FinishReduction take `dtype` (the CPU devices take every dtype).
  virtual bool Arithmetic(DataType) const { return true; }
  /// dst[i] = op(a[i], b[i]) (ReduceTwo's arithmetic; dst may equal a).
  virtual void Reduce(void* dst, const void* a, const void* b, size_t n, DataType dtype, ReduceOp op,
                      Stream& stream) = 0;
  /// buf[i] *= factor (ScaleInPlace's arithmetic).
  virtual void Scale(void* buf, size_t n, DataType dtype, double factor, Stream& stream) = 0;
  /// The end of a reduction over `ranks` ranks (FinishReduction's arithmetic: Average divides).
  virtual void FinishReduction(void* buf, size_t n, DataType dtype, ReduceOp op, double postscale, int ranks,
                               Stream& stream) = 0;
  /// dst[i] = a[i] - b[i], float32 (what an encoding lost: error-feedback residuals).
  virtual void Subtract(float* dst, const float* a, const float* b, size_t n, Stream& stream) = 0;
  /// Whether every value of buf is finite (waits for the stream: the answer is for the host).
  virtual bool AllFinite(const float* buf, size_t n, Stream& stream) = 0;
  /// DGC's momentum correction (DgcAccumulate of ops/reduce/reduce.h): u, v and grad
  /// updated in place, grad becomes the velocity.
  virtual void DgcAccumulate(float* u, float* v, float* grad, size_t n, float momentum, bool nesterov,
                             Stream& stream) = 0;
  /// buf[i] = 0 for each of the `count` indices at `host_indices` (host memory, each < n).
  virtual void ZeroAt(float* buf, size_t n, const uint32_t* host_indices, size_t count, Stream& stream) = 0;

 protected:
  /// Implementations count each Allocate / AllocateHost here.
  std::atomic<uint64_t> allocations_{0};
};

/// The host device (one per process; stateless).
Device& HostDevice();

/// A separate-memory host device for tests, with room for `capacity` bytes of buffers (the
/// address space is reserved, the memory committed as it is used). Its pointers lie in a
/// reserved range that is never readable: dereferencing one outside the device's own calls
/// faults, and its calls reject host pointers where device ones belong and the reverse.
std::unique_ptr<Device> NewSeparateMemoryDevice(size_t capacity = size_t{8} << 30);

}  // namespace gradcomp
