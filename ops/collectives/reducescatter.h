// Reduce-scatter: the reduction of a buffer, each rank keeping one slice of the result.
#pragma once

#include <string>
#include <vector>

#include "ops/comm/communicator.h"

namespace gradcomp {

/// Arguments of one reduce-scatter: `input` holds sum(counts) elements; rank r receives the
/// reduced slice of counts[r] elements starting at the prefix sum of counts[0..r).
/// EvenSplit(total, size) gives Horovod's default split.
struct ReducescatterOptions {
  const void* input = nullptr;
  void* output = nullptr;
  std::vector<size_t> counts;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  std::string name;
};

/// Reduces across ranks; each rank keeps its slice.
void Reducescatter(Communicator& comm, const ReducescatterOptions& opts);

}  // namespace gradcomp
