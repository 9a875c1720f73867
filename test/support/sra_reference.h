// The analytic error bound of the SRA compressed allreduce (see
// ops/collectives/compressed_allreduce.h), computed from the participants' inputs, and the
// options and inputs the compressed allreduce tests share.
#pragma once

#include <cstddef>
#include <vector>

#include "ops/collectives/compressed_allreduce.h"

namespace gradcomp::testing {

/// The options of averaging `in` into `out` with `codec` (max-min: `bits` and buckets of
/// `bucket`), named "grad", as the runtime would ask for them.
CompressedAllreduceOptions AverageWith(const std::vector<float>& in, std::vector<float>& out,
                                       const char* codec = "maxmin", int bits = 4, size_t bucket = 512);

/// Per-element bound of |SRA output - exact| for participants' float32 inputs `parts`
/// (equal lengths), output scale `scale`, max-min with `bits` and buckets of `bucket`, one
/// tensor, chunks EvenSplit(count, parts.size()). Stochastic rounding doubles each term.
std::vector<double> SraBound(const std::vector<std::vector<float>>& parts, double scale, int bits, size_t bucket,
                             bool stochastic);

/// The same for the 2-D SRA over a grid of rows of `columns` participants (participant w is in
/// row w / columns, column w % columns).
std::vector<double> Sra2dBound(const std::vector<std::vector<float>>& parts, double scale, int bits, size_t bucket,
                               bool stochastic, int columns);

/// The same for the 2-D SRA on nested grids: `columns` are the row lengths of each level,
/// outermost first (participant w in row w / columns[0]; the rows, in order, are the participants
/// of the next level), the last level's columns a flat SRA. {} is SraBound, {c} Sra2dBound.
std::vector<double> NestedSraBound(const std::vector<std::vector<float>>& parts, double scale, int bits,
                                   size_t bucket, bool stochastic, const std::vector<int>& columns);

/// Exact scale * sum of the parts, in float64.
std::vector<double> ExactSum(const std::vector<std::vector<float>>& parts, double scale);

/// ||got - exact|| / ||exact||.
double RelativeL2(const std::vector<float>& got, const std::vector<double>& exact);

/// Deterministic test gradients: rank r of `ranks`, `count` values: a shared signal plus
/// `noise` times rank-specific Gaussian noise (noise >= 1e3 means independent inputs).
std::vector<float> Gradient(size_t count, int rank, double noise, unsigned seed = 1);

}  // namespace gradcomp::testing
