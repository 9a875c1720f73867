// The pieces of adaptive compression that need no runtime (L-GreCo's formulation, MLSys 2024):
// the candidate settings of an "auto" spec, each candidate's error on a gradient, and the
// per-tensor choice that minimizes the bytes on the wire while the total error stays at most
// the reference setting's.
//
// Error. For a tensor x and a candidate c, e(x, c) = ||decode(encode_c(x)) - x||^2: the
// squared L2 error the candidate adds to this rank's contribution (and to the reduced sum,
// MeasureCandidates). The runtime sums e and
// ||x||^2 over ranks (each rank's contribution is compressed on its own in SRA). Squared
// absolute errors add up over tensors to the squared error of the whole gradient, so the
// constraint "sum over tensors of e(t, c_t) <= sum of e(t, reference)" says: the model's
// gradient is no further from exact than under the uniform reference. Relative errors
// (sqrt(e / ||x||^2)) are what stats and the timeline show.
//
// Choice. A multiple-choice knapsack solved by dynamic programming over the error budget
// discretized in `levels` steps (error rounded up, so a choice's real error never exceeds its
// discretized one): the budget in steps is the reference's own discretized total, which keeps
// the reference itself feasible and bounds the real total error by the reference's plus one
// step per tensor (levels >= 100 x tensors: within 1%).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/common/dtype.h"
#include "ops/compression/spec.h"

namespace gradcomp {

/// The settings an auto spec chooses from (its auto_candidates), each a concrete spec that
/// shares the auto spec's bucket size, rounding, last-bucket handling and error feedback.
/// Tokens: none, fp16, bf16, maxminB (B in 1..8), topkR (R in (0, 1], e.g. topk0.01).
/// Throws InvalidArgument naming the token and `what` (the setting or argument).
std::vector<CompressionSpec> AutoCandidates(const CompressionSpec& auto_spec, const std::string& what = "candidates");
/// Throws InvalidArgument, beginning with `what`, unless `spec` can run: its codec's Validate and
/// DGC momentum in [0, 1); for auto, every candidate and the reference, and interval >= 1.
void ValidateSpec(const CompressionSpec& spec, const std::string& what);
/// The uniform setting whose total error bounds an auto spec's: maxmin with its options.
CompressionSpec AutoReference(const CompressionSpec& auto_spec);
/// The settings whose errors bound a tensor's outside critical regimes (auto_relaxed_bits > 0):
/// the reference at auto_relaxed_bits, auto_relaxed_bits + 1, ..., one bit fewer than its own
/// (empty with relaxed bits off). A calm tensor steps down this ladder one bit per choice.
std::vector<CompressionSpec> AutoRelaxedLadder(const CompressionSpec& auto_spec);
/// The short name of a candidate ("maxmin4", "topk0.01", "none"), as in auto_candidates.
std::string CandidateToken(const CompressionSpec& spec);

/// Values a tensor's candidates are measured on (evenly spaced whole buckets, see below).
constexpr size_t kAutoSampleValues = size_t{1} << 16;

/// One tensor's statistics: ||x||^2 and e(x, c) for each candidate (the same order), scaled
/// to the whole tensor when measured on a sample.
struct CandidateErrors {
  double norm2 = 0;
  std::vector<double> err2;
  /// With error feedback (an auto spec with it): e(x + r, c), each candidate's error on what
  /// this step compresses, the gradient plus the residual r the tensor carries (empty
  /// without a residual).
  std::vector<double> err2_ef;
  /// Seconds one encode and one decode of the whole tensor take with each candidate on this
  /// rank (timed on the sample, scaled; 0 for none).
  std::vector<double> codec_seconds;
};
/// Measures every candidate on x (n float32 values), as this rank's share of the error of an
/// allreduce over `ranks` ranks. Dense codecs quantize twice in SRA: each rank's contribution,
/// then the reduced sum of the decoded contributions, whose range grows with the ranks; that
/// second error, per rank, is estimated on a sum of m = min(ranks, 4) copies of x rotated by
/// n / m (whole buckets apart, standing in for the other ranks' gradients): e(x, c) +
/// e(sum, c) / m. Sparse codecs (topk) add the first only. Tensors above `sample_values`
/// values are measured on evenly spaced whole buckets (of the first candidate's bucket size,
/// at least 1024 values a block) adding up to about `sample_values`, scaled by n / sampled.
/// With `residual` (n values, error feedback), err2_ef too: the same errors on x + residual, on
/// the same sample.
CandidateErrors MeasureCandidates(const float* x, size_t n, const std::vector<CompressionSpec>& candidates,
                                  int ranks = 1, size_t sample_values = kAutoSampleValues,
                                  const float* residual = nullptr);

/// What sending a tensor costs on a communicator: seconds = latency + bytes x per_byte, fitted
/// from timed uncompressed allreduces of two sizes, the latency never under that of a
/// one-value allreduce (the executor's probe).
struct LinkCost {
  double latency = 0;
  double per_byte = 0;
  bool known() const { return per_byte > 0 || latency > 0; }
  /// An allreduce of `wire_bytes` payload whose codec work (encode and decode of the tensor)
  /// takes `codec_seconds`: SRA encodes and decodes about twice (its contribution and then
  /// its reduced chunk; the allgather's chunks), not overlapped (a bound: the pipeline hides
  /// part of it across nodes).
  double Seconds(double wire_bytes, double codec_seconds) const {
    return latency + wire_bytes * per_byte + 2 * codec_seconds;
  }
  /// The line through two timed sizes (bytes, seconds), never negative; its latency at least
  /// `least_latency` (a timed one-value allreduce: where the small size is already bound by
  /// bandwidth, as at memory speed, noise can put the line's intercept at or under zero).
  static LinkCost Fit(double small_bytes, double small_seconds, double large_bytes, double large_seconds,
                      double least_latency = 0);
};

/// Bytes n values of `dtype` take on the wire under `spec` (for topk: the most).
double WireBytes(const CompressionSpec& spec, size_t n, DataType dtype);

/// The dynamic program: for each tensor t the index c of candidate with err2[t][c] and
/// bytes[t][c], minimizing the sum of bytes subject to sum of err2 <= sum of ref_err2
/// (discretized as above; `levels` 0: 100 x tensors, at least 1000). A tensor with a
/// candidate of no error and least bytes takes it whatever the budget.
struct AutoChoice {
  std::vector<size_t> index;  ///< per tensor
  double bytes = 0;           ///< total of the choice
  double err2 = 0;            ///< total error of the choice
  double ref_bytes = 0;       ///< the reference's total bytes
  double ref_err2 = 0;        ///< the budget
};
AutoChoice ChooseCandidates(const std::vector<std::vector<double>>& err2, const std::vector<std::vector<double>>& bytes,
                            const std::vector<double>& ref_err2, const std::vector<double>& ref_bytes,
                            size_t levels = 0);

}  // namespace gradcomp
