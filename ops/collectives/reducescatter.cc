#include "ops/collectives/reducescatter.h"

#include <cstring>

#include "ops/collectives/context.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

void Reducescatter(Communicator& comm, const ReducescatterOptions& o) {
  WithTensorContext("reducescatter", o.name, [&] {
    if (o.counts.size() != static_cast<size_t>(comm.size())) {
      throw InvalidArgument("reducescatter needs one count per rank: got " + std::to_string(o.counts.size()) +
                            " for " + std::to_string(comm.size()) + " ranks");
    }
    if (o.dtype == DataType::kBool && o.op == ReduceOp::kAverage) {
      throw InvalidArgument("reducescatter: op average is not defined for bool tensors");
    }
    size_t total = 0;
    for (size_t c : o.counts) total += c;
    const size_t esize = DataTypeSize(o.dtype);
    const void* src = o.input;
    std::vector<char> scaled;
    if (o.prescale != 1.0 && total > 0) {
      scaled.assign(static_cast<const char*>(o.input), static_cast<const char*>(o.input) + total * esize);
      ScaleInPlace(scaled.data(), total, o.dtype, o.prescale);
      src = scaled.data();
    }
    const ReduceOp op = o.op == ReduceOp::kAverage ? ReduceOp::kSum : o.op;
    comm.ReduceScatter(src, o.output, o.counts, o.dtype, op);
    FinishReduction(o.output, o.counts[static_cast<size_t>(comm.rank())], o.dtype, o.op, o.postscale, comm.size());
  });
}

}  // namespace gradcomp
