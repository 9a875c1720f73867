#include "ops/device/cpu_device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "ops/common/enforce.h"
#include "ops/common/simulation.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

namespace {

// Work runs when it is called: a CPU stream is always idle and an event always reached.
class CpuStream final : public Stream {
 public:
  void Synchronize() override {}
};

class CpuEvent final : public Event {
 public:
  void Record(Stream&) override {}
  bool Query() override { return true; }
  void Synchronize() override {}
  void Block(Stream&) override {}
};

// The host itself: device pointers are host addresses.
class Host final : public CpuDevice {
 public:
  const char* name() const override { return "host"; }
  MemorySpace space() const override { return MemorySpace::kHost; }
  void* Allocate(size_t bytes) override { return AllocateHost(bytes); }  // counted there
  void Free(void* ptr, size_t bytes) override { FreeHost(ptr, bytes); }

 protected:
  void* Resolve(const void* ptr, size_t, const char*) const override { return const_cast<void*>(ptr); }
  void CheckHost(const void*, size_t, const char*) const override {}
};

size_t ElementBytes(DataType dtype, size_t n) { return n * DataTypeSize(dtype); }

}  // namespace

void* CpuDevice::AllocateHost(size_t bytes) {
  ++allocations_;
  if (void* shared = sim::SharedAllocate(bytes)) return shared;
  void* p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void CpuDevice::FreeHost(void* ptr, size_t) {
  if (!sim::SharedFree(ptr)) std::free(ptr);
}

std::unique_ptr<Stream> CpuDevice::NewStream() { return std::make_unique<CpuStream>(); }
std::unique_ptr<Event> CpuDevice::NewEvent() { return std::make_unique<CpuEvent>(); }

void CpuDevice::CopyToHost(void* host_dst, const void* src, size_t bytes, Stream&) {
  CheckHost(host_dst, bytes, "CopyToHost destination");
  const void* s = Resolve(src, bytes, "CopyToHost source");
  if (bytes > 0) std::memcpy(host_dst, s, bytes);
}

void CpuDevice::CopyFromHost(void* dst, const void* host_src, size_t bytes, Stream&) {
  CheckHost(host_src, bytes, "CopyFromHost source");
  void* d = Resolve(dst, bytes, "CopyFromHost destination");
  if (bytes > 0) std::memcpy(d, host_src, bytes);
}

void CpuDevice::Copy(void* dst, const void* src, size_t bytes, Stream&) {
  void* d = Resolve(dst, bytes, "Copy destination");
  const void* s = Resolve(src, bytes, "Copy source");
  sim::CountWork(sim::Work::kCopy, nullptr, static_cast<double>(bytes) / 4);
  if (bytes > 0 && d != s) std::memcpy(d, s, bytes);
}

void CpuDevice::Fill(void* dst, uint8_t value, size_t bytes, Stream&) {
  void* d = Resolve(dst, bytes, "Fill destination");
  if (bytes > 0) std::memset(d, value, bytes);
}

void CpuDevice::Cast(const void* in, DataType in_dtype, size_t n, void* out, DataType out_dtype, bool accumulate,
                     Stream&) {
  CastBuffer(Resolve(in, ElementBytes(in_dtype, n), "Cast input"), in_dtype, n,
             Resolve(out, ElementBytes(out_dtype, n), "Cast output"), out_dtype, accumulate);
}

void CpuDevice::Reduce(void* dst, const void* a, const void* b, size_t n, DataType dtype, ReduceOp op, Stream&) {
  const size_t bytes = ElementBytes(dtype, n);
  sim::CountWork(sim::Work::kElementwise, nullptr, static_cast<double>(n));
  ReduceTwo(Resolve(dst, bytes, "Reduce output"), Resolve(a, bytes, "Reduce input"), Resolve(b, bytes, "Reduce input"),
            n, dtype, op);
}

void CpuDevice::Scale(void* buf, size_t n, DataType dtype, double factor, Stream&) {
  sim::CountWork(sim::Work::kElementwise, nullptr, static_cast<double>(n));
  ScaleInPlace(Resolve(buf, ElementBytes(dtype, n), "Scale buffer"), n, dtype, factor);
}

void CpuDevice::FinishReduction(void* buf, size_t n, DataType dtype, ReduceOp op, double postscale, int ranks,
                                Stream&) {
  gradcomp::FinishReduction(Resolve(buf, ElementBytes(dtype, n), "FinishReduction buffer"), n, dtype, op, postscale,
                            ranks);
}

void CpuDevice::Subtract(float* dst, const float* a, const float* b, size_t n, Stream&) {
  const size_t bytes = n * sizeof(float);
  auto* d = static_cast<float*>(Resolve(dst, bytes, "Subtract output"));
  const auto* x = static_cast<const float*>(Resolve(a, bytes, "Subtract input"));
  const auto* y = static_cast<const float*>(Resolve(b, bytes, "Subtract input"));
  sim::CountWork(sim::Work::kElementwise, nullptr, static_cast<double>(n));
  for (size_t i = 0; i < n; ++i) d[i] = x[i] - y[i];
}

bool CpuDevice::AllFinite(const float* buf, size_t n, Stream&) {
  return gradcomp::AllFinite(static_cast<const float*>(Resolve(buf, n * sizeof(float), "AllFinite buffer")), n);
}

void CpuDevice::DgcAccumulate(float* u, float* v, float* grad, size_t n, float momentum, bool nesterov, Stream&) {
  const size_t bytes = n * sizeof(float);
  gradcomp::DgcAccumulate(static_cast<float*>(Resolve(u, bytes, "DgcAccumulate momentum")),
                          static_cast<float*>(Resolve(v, bytes, "DgcAccumulate velocity")),
                          static_cast<float*>(Resolve(grad, bytes, "DgcAccumulate gradient")), n, momentum, nesterov);
}

void CpuDevice::ZeroAt(float* buf, size_t n, const uint32_t* host_indices, size_t count, Stream&) {
  CheckHost(host_indices, count * sizeof(uint32_t), "ZeroAt indices");
  auto* b = static_cast<float*>(Resolve(buf, n * sizeof(float), "ZeroAt buffer"));
  for (size_t j = 0; j < count; ++j) {
    GC_ENFORCE(host_indices[j] < n, "ZeroAt: index ", host_indices[j], " outside ", n, " values");
    b[host_indices[j]] = 0.0f;
  }
}

Device& HostDevice() {
  static Host host;
  return host;
}

}  // namespace gradcomp
