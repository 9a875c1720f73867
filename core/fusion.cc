#include "core/fusion.h"

#include <algorithm>
#include <iterator>
#include <type_traits>
#include <utility>

namespace gradcomp {

bool Fusable(const Response& a, const Response& b) {
  return a.type == RequestType::kAllreduce && b.type == RequestType::kAllreduce && a.error.empty() &&
         b.error.empty() && a.dtype == b.dtype && a.op == b.op && a.prescale == b.prescale &&
         a.postscale == b.postscale && a.compression == b.compression && a.on_device == b.on_device;
}

template <typename R>
void FusionPlanner::AddImpl(R&& r) {
  const int64_t bytes = r.PayloadBytes();
  if (threshold_ > 0 && r.type == RequestType::kAllreduce && r.error.empty() && bytes < kAloneBytes) {
    for (Open& g : open_) {
      Response& group = out_[g.index];
      if (g.bytes + bytes <= threshold_ && Fusable(group, r)) {
        // One priority per tensor, as the shapes (an empty list reads as all 0).
        group.priorities.resize(group.names.size(), 0);
        for (size_t k = 0; k < r.names.size(); ++k) {
          group.priorities.push_back(k < r.priorities.size() ? r.priorities[k] : 0);
        }
        if constexpr (std::is_lvalue_reference_v<R>) {
          group.names.insert(group.names.end(), r.names.begin(), r.names.end());
          group.shapes.insert(group.shapes.end(), r.shapes.begin(), r.shapes.end());
        } else {
          std::move(r.names.begin(), r.names.end(), std::back_inserter(group.names));
          std::move(r.shapes.begin(), r.shapes.end(), std::back_inserter(group.shapes));
        }
        g.bytes += bytes;
        return;
      }
    }
    if (bytes < threshold_) open_.push_back(Open{out_.size(), bytes});
  }
  out_.push_back(std::forward<R>(r));
}

void FusionPlanner::Add(const Response& r) { AddImpl(r); }
void FusionPlanner::Add(Response&& r) { AddImpl(std::move(r)); }

std::vector<Response> FusionPlanner::Take() {
  open_.clear();
  std::vector<Response> out;
  out.swap(out_);
  return out;
}

std::vector<Response> FuseResponses(std::vector<Response> responses, int64_t threshold_bytes) {
  FusionPlanner planner(threshold_bytes);
  for (Response& r : responses) planner.Add(std::move(r));
  return planner.Take();
}

}  // namespace gradcomp
