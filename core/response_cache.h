// Responses of tensors that were negotiated before, so steady-state training skips the
// coordinator: every rank keeps an identical cache (same insertions, same evictions, in
// the same order), and a tensor is agreed by setting the bit of its cache position.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/message.h"

namespace gradcomp {

/// A fixed number of positions holding single-tensor responses, least recently used evicted.
class ResponseCache {
 public:
  explicit ResponseCache(size_t capacity);

  enum class Lookup { kMiss, kHit, kMismatch };
  /// Whether `request` (from rank `rank` of `size`) would be answered by a cached response:
  /// kHit with its position, kMismatch (same name, other parameters) with the position to
  /// invalidate, or kMiss.
  Lookup Find(const Request& request, int rank, size_t* position) const;
  /// Caches an executed single-tensor response (all ranks call this in the same order).
  /// Returns the name of the tensor evicted to make room, or "".
  std::string Put(const Response& response);
  /// Marks a cached response used (executed from the cache).
  void Touch(size_t position);
  /// Position of `name`, or false when it is not cached.
  bool PositionOf(const std::string& name, size_t* position) const;
  /// The response at `position`.
  const Response& Get(size_t position) const;
  /// Removes the response at `position`, if any.
  void Erase(size_t position);
  size_t capacity() const { return slots_.size(); }
  size_t size() const { return by_name_.size(); }

  /// Types whose responses are cached (not barrier, join or errors).
  static bool Cacheable(const Response& response);

 private:
  struct Slot {
    bool used = false;
    uint64_t last_use = 0;
    Response response;
  };
  std::vector<Slot> slots_;
  std::unordered_map<std::string, size_t> by_name_;
  uint64_t clock_ = 0;
};

}  // namespace gradcomp
