#include "ops/device/buffer_pool.h"


namespace gradcomp {

namespace {

// Sizes are rounded so that steps asking for nearly the same sizes share buffers: powers of
// two up to 1 MiB, whole MiB above (at most 1 MiB or 2x wasted per buffer).
size_t SizeClass(size_t bytes) {
  constexpr size_t kMiB = size_t{1} << 20;
  if (bytes >= kMiB) return (bytes + kMiB - 1) / kMiB * kMiB;
  size_t c = 256;
  while (c < bytes) c <<= 1;
  return c;
}

}  // namespace

BufferPool::Buffer& BufferPool::Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    Release();
    pool_ = o.pool_;
    data_ = o.data_;
    capacity_ = o.capacity_;
    o.pool_ = nullptr;
  }
  return *this;
}

void BufferPool::Buffer::Release() {
  if (pool_ != nullptr) pool_->GiveBack(data_, capacity_);
  pool_ = nullptr;
}

BufferPool::~BufferPool() { Trim(); }

BufferPool::Buffer BufferPool::Get(size_t bytes) {
  const size_t want = SizeClass(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The smallest cached buffer that fits, unless it would waste more than half of itself.
    auto it = cached_.lower_bound(want);
    if (it != cached_.end() && it->first <= 2 * want) {
      Buffer b(this, it->second, it->first);
      cached_bytes_ -= it->first;
      cached_.erase(it);
      return b;
    }
    ++allocations_;
  }
  return Buffer(this, device_.Allocate(want), want);
}

void BufferPool::GiveBack(void* data, size_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  cached_.emplace(capacity, data);
  cached_bytes_ += capacity;
}

void BufferPool::Trim() {
  std::multimap<size_t, void*> cached;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cached.swap(cached_);
    cached_bytes_ = 0;
  }
  for (const auto& [capacity, data] : cached) device_.Free(data, capacity);
}

size_t BufferPool::allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocations_;
}

size_t BufferPool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_bytes_;
}

}  // namespace gradcomp
