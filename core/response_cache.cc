#include "core/response_cache.h"

#include "ops/common/enforce.h"

namespace gradcomp {

ResponseCache::ResponseCache(size_t capacity) : slots_(capacity) {}

bool ResponseCache::Cacheable(const Response& r) {
  return r.error.empty() && r.names.size() == 1 && r.type != RequestType::kBarrier && r.type != RequestType::kJoin;
}

namespace {
// Would `req` negotiate to exactly `resp`? (rank_dims hold every rank's part for
// allgather / alltoall; this rank's part must match its request.)
bool Matches(const Request& req, const Response& resp, int rank) {
  if (req.type != resp.type || req.dtype != resp.dtype || req.op != resp.op || req.root != resp.root ||
      req.prescale != resp.prescale || req.postscale != resp.postscale || req.compression != resp.compression ||
      req.priority != resp.Priority()) {
    return false;
  }
  // A response for device memory needs this rank's tensor there; one staged through the host
  // serves either.
  if (resp.on_device && !req.on_device) return false;
  const std::vector<int64_t>& shape = resp.shapes[0];
  if (req.type == RequestType::kAllgather || req.type == RequestType::kAlltoall) {
    if (req.shape.size() != shape.size() || req.shape.empty()) return false;
    for (size_t d = 1; d < shape.size(); ++d) {
      if (req.shape[d] != shape[d]) return false;
    }
    if (req.type == RequestType::kAllgather) {
      return resp.rank_dims.size() > static_cast<size_t>(rank) &&
             resp.rank_dims[static_cast<size_t>(rank)] == req.shape[0];
    }
    // alltoall: this rank's splits are row `rank` of the size x size matrix.
    const size_t n = req.splits.size();
    const size_t row = static_cast<size_t>(rank) * n;
    if (resp.rank_dims.size() < row + n) return false;
    for (size_t p = 0; p < n; ++p) {
      if (resp.rank_dims[row + p] != req.splits[p]) return false;
    }
    return true;
  }
  return req.shape == shape;
}
}  // namespace

ResponseCache::Lookup ResponseCache::Find(const Request& request, int rank, size_t* position) const {
  auto it = by_name_.find(request.name);
  if (it == by_name_.end()) return Lookup::kMiss;
  *position = it->second;
  return Matches(request, slots_[it->second].response, rank) ? Lookup::kHit : Lookup::kMismatch;
}

std::string ResponseCache::Put(const Response& response) {
  std::string evicted;
  if (slots_.empty() || !Cacheable(response)) return evicted;
  const std::string& name = response.names[0];
  auto it = by_name_.find(name);
  size_t pos;
  if (it != by_name_.end()) {
    pos = it->second;
  } else {
    pos = slots_.size();
    for (size_t i = 0; i < slots_.size() && pos == slots_.size(); ++i) {
      if (!slots_[i].used) pos = i;
    }
    if (pos == slots_.size()) {  // full: evict the least recently used
      pos = 0;
      for (size_t i = 1; i < slots_.size(); ++i) {
        if (slots_[i].last_use < slots_[pos].last_use) pos = i;
      }
      evicted = slots_[pos].response.names[0];
      by_name_.erase(evicted);
    }
    by_name_[name] = pos;
  }
  slots_[pos].used = true;
  slots_[pos].last_use = ++clock_;
  slots_[pos].response = response;
  return evicted;
}

void ResponseCache::Touch(size_t position) {
  GC_ENFORCE(position < slots_.size() && slots_[position].used, "touching empty cache position ", position);
  slots_[position].last_use = ++clock_;
}

bool ResponseCache::PositionOf(const std::string& name, size_t* position) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return false;
  *position = it->second;
  return true;
}

const Response& ResponseCache::Get(size_t position) const {
  GC_ENFORCE(position < slots_.size() && slots_[position].used, "reading empty cache position ", position);
  return slots_[position].response;
}

void ResponseCache::Erase(size_t position) {
  if (position >= slots_.size() || !slots_[position].used) return;
  by_name_.erase(slots_[position].response.names[0]);
  slots_[position] = Slot();
}

}  // namespace gradcomp
