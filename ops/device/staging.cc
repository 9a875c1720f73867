#include "ops/device/staging.h"

#include <algorithm>
#include <utility>

namespace gradcomp {

void* Scratch::Reserve(Device& device, size_t bytes, bool host) {
  if (device_ == &device && host_ == host && data_ != nullptr && capacity_ >= bytes) return data_;
  // Grown by at least half, so a size creeping up step by step reallocates only a few times.
  const bool same = device_ == &device && host_ == host;
  const size_t want = same && data_ != nullptr ? std::max(bytes, capacity_ + capacity_ / 2) : bytes;
  Release();
  data_ = host ? device.AllocateHost(want) : device.Allocate(want);
  device_ = &device;
  host_ = host;
  capacity_ = want;
  return data_;
}

void Scratch::Release() {
  if (data_ != nullptr) {
    if (host_) {
      device_->FreeHost(data_, capacity_);
    } else {
      device_->Free(data_, capacity_);
    }
  }
  data_ = nullptr;
  capacity_ = 0;
}

void Scratch::Swap(Scratch& other) noexcept {
  std::swap(device_, other.device_);
  std::swap(host_, other.host_);
  std::swap(data_, other.data_);
  std::swap(capacity_, other.capacity_);
}

void StagedBuffer::Swap(StagedBuffer& other) noexcept {
  std::swap(dev_, other.dev_);
  std::swap(aliased_, other.aliased_);
  std::swap(wire_on_device_, other.wire_on_device_);
  std::swap(bytes_, other.bytes_);
  device_.Swap(other.device_);
  host_.Swap(other.host_);
}

void StagedBuffer::Reserve(Device& device, size_t bytes, bool wire_on_device) {
  dev_ = &device;
  aliased_ = device.space() == MemorySpace::kHost;
  wire_on_device_ = wire_on_device || aliased_;
  bytes_ = bytes;
  if (aliased_) {
    host_.Reserve(device, bytes, true);
    return;
  }
  device_.Reserve(device, bytes);
  if (!wire_on_device_) host_.Reserve(device, bytes, true);
}

uint8_t* StagedBuffer::host() {
  if (!aliased_ && dev_ != nullptr) host_.Reserve(*dev_, bytes_, true);  // nothing once it fits
  return static_cast<uint8_t*>(host_.data());
}

void StagedBuffer::ToHost(size_t at, size_t bytes, Stream& stream) {
  if (!aliased_ && bytes > 0) dev_->CopyToHost(host() + at, device() + at, bytes, stream);
}

void StagedBuffer::ToDevice(size_t at, size_t bytes, Stream& stream) {
  if (!aliased_ && bytes > 0) dev_->CopyFromHost(device() + at, host() + at, bytes, stream);
}

}  // namespace gradcomp
