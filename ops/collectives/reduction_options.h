// The arguments every reduction of a buffer shares (allreduce, reduce-scatter, compressed
// allreduce); each collective's options add how many elements go where.
#pragma once

#include <string>

#include "ops/common/dtype.h"

namespace gradcomp {

/// The buffers, their dtype, the op and the scale factors of a reduction, and the tensor's name.
struct ReductionOptions {
  const void* input = nullptr;
  void* output = nullptr;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  /// Multiplies the input before the reduction.
  double prescale = 1.0;
  /// Multiplies the result (after Average's division by the number of ranks).
  double postscale = 1.0;
  /// The tensor's name, for error messages.
  std::string name;
};

}  // namespace gradcomp
