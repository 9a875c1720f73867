// Scratch memory of the data path on a device: buffers that keep their allocation from call to
// call and grow on demand (so the hot path allocates only while sizes still grow), and staged
// buffers, a device buffer with the host copy the network reads and writes. On the host
// device a staged buffer's two sides are the same memory and staging copies nothing: today's
// CPU path, no extra copies.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/device/device.h"

namespace gradcomp {

/// Memory of a device (or host staging memory of it, with `host`) that grows on demand.
class Scratch {
 public:
  Scratch() = default;
  ~Scratch() { Release(); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  /// At least `bytes` bytes of `device`'s memory (host staging memory with `host`). What the
  /// buffer held is lost when it grows or the device changes.
  void* Reserve(Device& device, size_t bytes, bool host = false);
  void* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  void Release();

 private:
  Device* device_ = nullptr;
  bool host_ = false;
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

/// A buffer on a device and its host staging copy (the same memory on the host device).
class StagedBuffer {
 public:
  /// Reserves `bytes` on `device` and as much host staging; contents are lost when it grows.
  void Reserve(Device& device, size_t bytes);
  /// Reserves only the host side (a buffer the device never sees).
  void ReserveHost(Device& device, size_t bytes);
  uint8_t* device() const { return static_cast<uint8_t*>(device_side().data()); }
  uint8_t* host() const { return static_cast<uint8_t*>(host_.data()); }
  template <typename T>
  T* device_as() const {
    return reinterpret_cast<T*>(device());
  }
  template <typename T>
  T* host_as() const {
    return reinterpret_cast<T*>(host());
  }
  /// Host side [at, at + bytes) = device side (nothing when they are the same memory).
  void ToHost(size_t at, size_t bytes, Stream& stream);
  /// Device side [at, at + bytes) = host side.
  void ToDevice(size_t at, size_t bytes, Stream& stream);

 private:
  const Scratch& device_side() const { return aliased_ ? host_ : device_; }

  Device* dev_ = nullptr;
  bool aliased_ = true;
  Scratch device_, host_;
};

}  // namespace gradcomp
