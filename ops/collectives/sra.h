// SRA (scatter-reduce-allgather), the compressed allreduce of compressed_allreduce.h: its
// reduce-scatter half then its allgather half (sra_halves.h) over its plan (sra_plan.h), run over
// a communicator by a blocking driver (one alltoall, one allgather) or a striped one
// (point-to-point stripes whose encoding and decoding overlap the network), and the 2-D SRA.
// Internal to ops/collectives; the hierarchical algorithm runs them across nodes.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "ops/collectives/sra_plan.h"

namespace gradcomp {

/// A dense algorithm on the float32 working copy x (prescaled, compensated), writing the scaled
/// result to out, as Sra and Sra2d.
using DenseAlgorithm = std::function<void(const float* x, const OutputScaling& scale, float* out,
                                          CompressionWorkspace& ws, CompressedAllreduceStats* st)>;
/// The frame of a dense compressed allreduce over `ranks` ranks: the options checked (errors
/// name `what` and the tensor), the working copy and the result buffer made, the output stored.
CompressedAllreduceStats RunDenseAllreduce(const char* what, const CompressedAllreduceOptions& o, int ranks,
                                           const DenseAlgorithm& algorithm);

/// 2-D SRA of x (as Sra, over `grid`; compressed_allreduce.h).
void Sra2d(const Grid& grid, const CompressedAllreduceOptions& o, const float* x, const OutputScaling& scale,
           float* out, CompressionWorkspace& ws, CompressedAllreduceStats* st);

/// SRA of the o.count float32 values x (already prescaled and compensated) into float32 `out`
/// (which may alias x), scaled by `scale`; o.residual and o.reduced_residual receive the
/// errors of the two compressions. Adds to `st`. The none codec's values travel from x and into
/// out as they are, unless the caller reads the encodings afterwards (`keep_encodings`: this
/// rank's reduced chunk in ws.own, every other's in ws.all, in the plan's layout).
void Sra(Communicator& comm, const CompressedAllreduceOptions& o, const float* x, const OutputScaling& scale,
         float* out, CompressionWorkspace& ws, CompressedAllreduceStats* st, bool keep_encodings = false);

}  // namespace gradcomp
