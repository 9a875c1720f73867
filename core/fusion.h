// Tensor fusion (Horovod's): allreduce responses that agree on dtype, op, scale factors and
// compression are packed into one fusion buffer up to the threshold, so many small
// gradients travel as one message.
#pragma once

#include <cstdint>
#include <vector>

#include "core/message.h"

namespace gradcomp {

/// A tensor of at least this many bytes is reduced alone, where it lies: fused, it would be
/// copied into the fusion buffer and back, two passes over it on the rank's core, to save one
/// response's latency (the 25.2M-parameter MLP of step_bench.py, whose 16 MiB gradient was fused
/// with a 40 KB one: the exchange threads' CPU 0.041-0.043 s a step before, 0.038 after). The
/// same in device memory, where the copies are cheap, so that a tensor's bytes on the wire and
/// its result do not depend on where it lives (test_runtime_device).
constexpr int64_t kAloneBytes = int64_t{16} << 20;

/// True when `a` and `b` may share a fusion buffer.
bool Fusable(const Response& a, const Response& b);

/// Builds a fusion plan one response at a time (what FuseResponses does for a whole list):
/// a response joins the earliest open group it fits; appending to a group copies only the
/// tensor's name and shape.
class FusionPlanner {
 public:
  explicit FusionPlanner(int64_t threshold_bytes) : threshold_(threshold_bytes) {}
  void Add(const Response& r);
  void Add(Response&& r);
  /// The plan so far; the planner is empty afterwards.
  std::vector<Response> Take();

 private:
  template <typename R>
  void AddImpl(R&& r);
  struct Open {
    size_t index;   // into out_
    int64_t bytes;  // payload so far
  };
  int64_t threshold_;
  std::vector<Response> out_;
  std::vector<Open> open_;  // allreduce groups that may still grow
};

/// Merges fusable allreduce responses, each fused response holding at most `threshold_bytes`
/// of payload (a single larger tensor still goes alone; 0 disables fusion). A response joins
/// the earliest open group it fits, so the result is a pure function of the input order and
/// every rank computes the same plan.
std::vector<Response> FuseResponses(std::vector<Response> responses, int64_t threshold_bytes);

}  // namespace gradcomp
