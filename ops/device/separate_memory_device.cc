// The separate-memory host device (device.h). Two regions of the same size are reserved: the
// pointers it hands out lie in the first, mapped with no access at all, and their bytes live
// at the same offset in the second. Only the device's own calls translate one into the other,
// so host code that dereferences a device pointer faults at once (SIGSEGV), and a host pointer
// given to a device call, or a device pointer given where host memory belongs, is an
// InvalidArgument naming the call.
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>
#include <mutex>

#include "ops/common/enforce.h"
#include "ops/device/cpu_device.h"

namespace gradcomp {

namespace {

constexpr size_t kAlign = 256;

std::string Hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

class SeparateMemory final : public CpuDevice {
 public:
  explicit SeparateMemory(size_t capacity) : capacity_((capacity + kAlign - 1) / kAlign * kAlign) {
    void* fake = mmap(nullptr, capacity_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void* real = mmap(nullptr, capacity_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (fake == MAP_FAILED || real == MAP_FAILED) {
      if (fake != MAP_FAILED) munmap(fake, capacity_);
      if (real != MAP_FAILED) munmap(real, capacity_);
      GC_THROW("separate-memory device: cannot reserve 2 x ", capacity_, " bytes of address space");
    }
    fake_ = static_cast<char*>(fake);
    real_ = static_cast<char*>(real);
  }
  ~SeparateMemory() override {
    munmap(fake_, capacity_);
    munmap(real_, capacity_);
  }
  SeparateMemory(const SeparateMemory&) = delete;
  SeparateMemory& operator=(const SeparateMemory&) = delete;

  const char* name() const override { return "separate-memory host (tests)"; }
  MemorySpace space() const override { return MemorySpace::kDevice; }

  void* Allocate(size_t bytes) override {
    ++allocations_;
    const size_t size = Rounded(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {  // first fit
      if (it->second < size) continue;
      const size_t at = it->first, left = it->second - size;
      free_.erase(it);
      if (left > 0) free_[at + size] = left;
      return fake_ + at;
    }
    if (size > capacity_ - top_) {
      GC_THROW("separate-memory device: ", bytes, " bytes do not fit in what is left of its ", capacity_, " bytes");
    }
    top_ += size;
    return fake_ + (top_ - size);
  }

  void Free(void* ptr, size_t bytes) override {
    if (ptr == nullptr) return;
    const size_t size = Rounded(bytes);
    const size_t at = static_cast<size_t>(static_cast<char*>(ptr) - fake_);
    GC_ENFORCE(Owns(ptr, size), "separate-memory device: freeing ", Hex(ptr), ", which it did not allocate");
    std::lock_guard<std::mutex> lock(mu_);
    auto next = free_.lower_bound(at);
    size_t start = at, len = size;
    if (next != free_.end() && next->first == at + size) {  // merge with the block after
      len += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {  // and with the block before
      auto prev = std::prev(next);
      if (prev->first + prev->second == at) {
        start = prev->first;
        len += prev->second;
        free_.erase(prev);
      }
    }
    if (start + len == top_) {
      top_ = start;  // give the tail back to the bump pointer, and its pages to the system
      madvise(real_ + start, len, MADV_DONTNEED);
    } else {
      free_[start] = len;
    }
  }

 protected:
  void* Resolve(const void* ptr, size_t bytes, const char* what) const override {
    if (ptr == nullptr && bytes == 0) return nullptr;
    if (!Owns(ptr, bytes)) {
      throw InvalidArgument(std::string("separate-memory device: ") + what + " " + Hex(ptr) + " (" +
                            std::to_string(bytes) + " bytes) is not this device's memory: a host buffer was "
                            "passed where a device buffer belongs");
    }
    return real_ + (static_cast<const char*>(ptr) - fake_);
  }

  void CheckHost(const void* ptr, size_t bytes, const char* what) const override {
    const auto* p = static_cast<const char*>(ptr);
    if (p + bytes > fake_ && p < fake_ + capacity_) {
      throw InvalidArgument(std::string("separate-memory device: ") + what + " " + Hex(ptr) +
                            " is device memory: a device buffer was passed where host memory belongs");
    }
  }

 private:
  static size_t Rounded(size_t bytes) { return (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign; }
  bool Owns(const void* ptr, size_t bytes) const {
    const auto* p = static_cast<const char*>(ptr);
    return p >= fake_ && p <= fake_ + capacity_ && bytes <= static_cast<size_t>(fake_ + capacity_ - p);
  }

  const size_t capacity_;
  char* fake_ = nullptr;  // the addresses handed out: never accessible
  char* real_ = nullptr;  // where their bytes are
  std::mutex mu_;
  std::map<size_t, size_t> free_;  // offset -> bytes of freed blocks below top_
  size_t top_ = 0;                 // bytes handed out from the start at least once
};

}  // namespace

std::unique_ptr<Device> NewSeparateMemoryDevice(size_t capacity) { return std::make_unique<SeparateMemory>(capacity); }

}  // namespace gradcomp
