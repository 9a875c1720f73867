// A caching allocator over a Device (c10's CUDACachingAllocator in miniature): buffers given
// back are kept and handed out again, so a data path that asks for the same sizes step after
// step allocates device memory only in its first steps, never on the hot path after that.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>

#include "ops/device/device.h"

namespace gradcomp {

class BufferPool {
 public:
  explicit BufferPool(Device& device) : device_(device) {}
  /// Frees every cached buffer (every Buffer must have been given back).
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  /// Device memory of at least `bytes` bytes, given back to the pool when destroyed.
  class Buffer {
   public:
    Buffer() = default;
    Buffer(Buffer&& o) noexcept : pool_(o.pool_), data_(o.data_), capacity_(o.capacity_) { o.pool_ = nullptr; }
    Buffer& operator=(Buffer&& o) noexcept;
    ~Buffer() { Release(); }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;

    void* data() const { return data_; }
    /// Bytes usable (at least what was asked for).
    size_t capacity() const { return capacity_; }

   private:
    friend class BufferPool;
    Buffer(BufferPool* pool, void* data, size_t capacity) : pool_(pool), data_(data), capacity_(capacity) {}
    void Release();

    BufferPool* pool_ = nullptr;
    void* data_ = nullptr;
    size_t capacity_ = 0;
  };

  /// A buffer of at least `bytes` bytes: a cached one of a close size, or a new allocation.
  Buffer Get(size_t bytes);
  /// Frees every cached buffer (after a step that needed unusually much memory).
  void Trim();

  Device& device() const { return device_; }
  /// Device allocations made so far, and the bytes cached now.
  size_t allocations() const;
  size_t cached_bytes() const;

 private:
  void GiveBack(void* data, size_t capacity);

  Device& device_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> cached_;  // capacity -> buffer
  size_t allocations_ = 0;
  size_t cached_bytes_ = 0;
};

}  // namespace gradcomp
