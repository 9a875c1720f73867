// The devices whose kernels run on the CPU (internal to ops/device): the host device and the
// separate-memory test device share every kernel here and differ only in how a device pointer
// becomes an address the CPU can use (Resolve) and how memory is allocated.
#pragma once

#include <string>

#include "ops/device/device.h"

namespace gradcomp {

class CpuDevice : public Device {
 public:
  void* AllocateHost(size_t bytes) override;
  void FreeHost(void* ptr, size_t bytes) override;
  std::unique_ptr<Stream> NewStream() override;
  std::unique_ptr<Event> NewEvent() override;

  void CopyToHost(void* host_dst, const void* src, size_t bytes, Stream& stream) override;
  void CopyFromHost(void* dst, const void* host_src, size_t bytes, Stream& stream) override;
  void Copy(void* dst, const void* src, size_t bytes, Stream& stream) override;
  void Fill(void* dst, uint8_t value, size_t bytes, Stream& stream) override;

  void Cast(const void* in, DataType in_dtype, size_t n, void* out, DataType out_dtype, bool accumulate,
            Stream& stream) override;
  void Reduce(void* dst, const void* a, const void* b, size_t n, DataType dtype, ReduceOp op,
              Stream& stream) override;
  void Scale(void* buf, size_t n, DataType dtype, double factor, Stream& stream) override;
  void FinishReduction(void* buf, size_t n, DataType dtype, ReduceOp op, double postscale, int ranks,
                       Stream& stream) override;
  void Subtract(float* dst, const float* a, const float* b, size_t n, Stream& stream) override;
  bool AllFinite(const float* buf, size_t n, Stream& stream) override;
  void DgcAccumulate(float* u, float* v, float* grad, size_t n, float momentum, bool nesterov,
                     Stream& stream) override;
  void ZeroAt(float* buf, size_t n, const uint32_t* host_indices, size_t count, Stream& stream) override;

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  void* HostAddress(const void* ptr, size_t bytes, const char* what) const override {
    return Resolve(ptr, bytes, what);
  }

 protected:
  /// The CPU address of `bytes` bytes at device pointer `ptr`; throws InvalidArgument naming
  /// `what` when they are not this device's memory.
  virtual void* Resolve(const void* ptr, size_t bytes, const char* what) const = 0;
  /// Throws InvalidArgument naming `what` when `ptr` is this device's memory but a host
  /// address is required.
  virtual void CheckHost(const void* ptr, size_t bytes, const char* what) const = 0;
};

}  // namespace gradcomp
