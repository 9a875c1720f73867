// Scratch memory of the data path on a device: buffers that keep their allocation from call to
// call and grow on demand (so the hot path allocates only while sizes still grow), and staged
// buffers, a device buffer with the host copy the network reads and writes. On the host
// device a staged buffer's two sides are the same memory and staging copies nothing: today's
// CPU path, no extra copies.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/common/simulation.h"
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
  /// Exchanges the two buffers' memory (no copy).
  void Swap(Scratch& other) noexcept;

 private:
  Device* device_ = nullptr;
  bool host_ = false;
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

/// A buffer on a device and its host copy (the same memory on the host device), with the side
/// a communicator reads and writes, its wire: the host copy, or the device buffer itself for a
/// communicator that takes device memory (then the host copy is made only if asked for).
class StagedBuffer {
 public:
  /// Reserves `bytes` on `device` and, unless the wire is on the device, as much host
  /// staging; contents are lost when it grows.
  void Reserve(Device& device, size_t bytes, bool wire_on_device = false);
  uint8_t* device() const { return static_cast<uint8_t*>(aliased_ ? host_.data() : device_.data()); }
  /// The host copy (reserved now if the wire is on the device).
  uint8_t* host();
  /// The side the communicator uses.
  uint8_t* wire() { return wire_on_device_ ? device() : host(); }
  template <typename T>
  T* device_as() const {
    return reinterpret_cast<T*>(device());
  }
  /// Host copy [at, at + bytes) = device side (nothing when they are the same memory).
  void ToHost(size_t at, size_t bytes, Stream& stream);
  /// Device side [at, at + bytes) = host copy.
  void ToDevice(size_t at, size_t bytes, Stream& stream);
  /// Wire [at, at + bytes) = device side, and the reverse (nothing when the wire is the device side).
  /// A simulation counts these as a GPU's copies to and from the host even on the host device
  /// (simulation.h: a GPU's profile prices them; a host profile's copies cost nothing).
  void ToWire(size_t at, size_t bytes, Stream& stream) {
    CountAsGpuCopy(sim::Work::kToHost, bytes);
    if (!wire_on_device_) ToHost(at, bytes, stream);
  }
  void FromWire(size_t at, size_t bytes, Stream& stream) {
    CountAsGpuCopy(sim::Work::kFromHost, bytes);
    if (!wire_on_device_) ToDevice(at, bytes, stream);
  }
  /// Counts, in a simulation, a GPU's copy of `bytes` to (kToHost) or from (kFromHost) the host:
  /// ToWire and FromWire's, and one a data path skips on the host device where a GPU's needs it.
  static void CountAsGpuCopy(sim::Work work, size_t bytes) {
    sim::CountWork(work, nullptr, static_cast<double>(bytes) / 4);
  }
  /// Exchanges the two buffers, contents and both sides (no copy).
  void Swap(StagedBuffer& other) noexcept;

 private:
  Device* dev_ = nullptr;
  bool aliased_ = true, wire_on_device_ = false;
  size_t bytes_ = 0;
  Scratch device_, host_;
};

}  // namespace gradcomp
