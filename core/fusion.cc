#include "core/fusion.h"

namespace gradcomp {

bool Fusable(const Response& a, const Response& b) {
  return a.type == RequestType::kAllreduce && b.type == RequestType::kAllreduce && a.error.empty() &&
         b.error.empty() && a.dtype == b.dtype && a.op == b.op && a.prescale == b.prescale &&
         a.postscale == b.postscale && a.compression == b.compression;
}

std::vector<Response> FuseResponses(const std::vector<Response>& responses, int64_t threshold_bytes) {
  std::vector<Response> out;
  std::vector<size_t> open;  // indices into `out` of allreduce groups that may still grow
  for (const Response& r : responses) {
    bool placed = false;
    if (threshold_bytes > 0 && r.type == RequestType::kAllreduce && r.error.empty()) {
      const int64_t bytes = r.PayloadBytes();
      for (size_t idx : open) {
        Response& group = out[idx];
        if (Fusable(group, r) && group.PayloadBytes() + bytes <= threshold_bytes) {
          group.names.insert(group.names.end(), r.names.begin(), r.names.end());
          group.shapes.insert(group.shapes.end(), r.shapes.begin(), r.shapes.end());
          placed = true;
          break;
        }
      }
      if (!placed && bytes < threshold_bytes) open.push_back(out.size());
    }
    if (!placed) out.push_back(r);
  }
  return out;
}

}  // namespace gradcomp
