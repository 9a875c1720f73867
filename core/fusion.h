// Tensor fusion (Horovod's): allreduce responses that agree on dtype, op, scale factors and
// compression are packed into one fusion buffer up to the threshold, so many small
// gradients travel as one message.
#pragma once

#include <cstdint>
#include <vector>

#include "core/message.h"

namespace gradcomp {

/// True when `a` and `b` may share a fusion buffer.
bool Fusable(const Response& a, const Response& b);

/// Merges fusable allreduce responses, each fused response holding at most `threshold_bytes`
/// of payload (a single larger tensor still goes alone; 0 disables fusion). A response joins
/// the earliest open group it fits, so the result is a pure function of the input order and
/// every rank computes the same plan.
std::vector<Response> FuseResponses(const std::vector<Response>& responses, int64_t threshold_bytes);

}  // namespace gradcomp
