// Adaptive compression in the runtime (GRADCOMP_COMPRESSION=auto, Compression.auto(...)):
// which setting each tensor of an "auto" spec runs with, and when that changes.
//
// Negotiation sees only the auto spec (every auto tensor of a rank asks for the same spec, so
// they fuse as before); the executor resolves each tensor's setting when it runs a response,
// and a fused response whose tensors resolve differently runs one compressed allreduce per
// setting. Every rank runs the same responses in the same order, so all of this keys off the
// response stream and is identical on every rank:
//
//  - each tensor counts the responses it took part in (its steps); on steps that are a
//    multiple of the spec's interval K, the executor measures every candidate's error on this
//    rank's gradient (ops/compression/auto_select.h; on a sample for large tensors) before
//    running it;
//  - at the first response after that (a tensor's step K m + 1), every rank allreduces the
//    measurements (sum over ranks of ||x||^2 and each candidate's squared error), rank 0
//    solves the dynamic program for each auto spec and broadcasts the choices, and the new
//    settings apply from that response on. Until a tensor's first choice it runs the reference.
//
// Cost model (GRADCOMP_AUTO_COST_MODEL): compression pays only where the link is slow next to
// the codecs. At the first choice, and every kProbeEvery choices, the ranks time uncompressed
// allreduces of 64 KB and 4 MB through the executor's own path (shared memory in a node, MPI
// or SRA across nodes) and fit latency + bytes x cost per byte (the latency no less than a
// one-value allreduce's, also timed); the candidates' encode and decode are timed on the
// gradients they are measured on. A candidate whose estimated
// allreduce (LinkCost::Seconds) is slower than none's is left out of that tensor's choice,
// so on one node nothing is compressed while across slow links the bytes decide.
//
// Critical regimes (auto_relaxed_bits > 0; Accordion, Agarwal et al., MLSys 2021): how much a
// gradient may lose matters most while training changes fast (the first steps, warm-up, after
// a learning-rate drop) and little after. As Accordion, each tensor sums its gradient over the
// steps between two choices (on a sample of up to kTrendValues values: the sum's norm follows
// the mean gradient, where one step's norm is mostly minibatch noise). At each choice a tensor
// whose summed gradient's norm (over ranks) moved by auto_critical_change or more since its
// previous choice, or that has no previous one, is critical and gets the reference's error
// budget. A calm tensor's budget steps down one bit a choice: the error of maxmin at one bit
// fewer than its previous budget's, down to auto_relaxed_bits (AutoRelaxedLadder); critical
// again, it is back at the reference's. Where Accordion drops at once, the ladder is what
// held the loss on the character LM (docs/benchmarks.md): the norm test calls the end of the
// critical phase an interval or two early, and 3 bits cost little where 1 bit costs much. The
// tensors of one budget share a program, so a critical tensor never spends the slack of calm
// ones. Rank 0 decides and broadcasts (with the choices). The sample costs a pass over
// kTrendValues values a tensor and step (for a GPU tensor, copies of its blocks).
//
// Error feedback: every candidate keeps the auto spec's error-feedback flag, so a tensor's
// residual stays valid when its bit width or codec changes; a tensor that moves to "none"
// sends its residual once (the "none" codec through the compressed path, exact) and drops it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "core/message.h"
#include "core/timeline.h"
#include "ops/comm/communicator.h"
#include "ops/compression/auto_select.h"

namespace gradcomp {

/// What one tensor of an auto spec runs with and what its last measurement said.
struct AutoTensorReport {
  std::string setting;       ///< CompressionSpec::Describe of the current setting
  uint64_t choice = 0;       ///< which choice set it (1 for the first one the runtime made)
  uint64_t measured_at = 0;  ///< the step of the last measurement (0: none yet)
  /// Relative L2 error sqrt(sum e / sum ||x||^2) over ranks, per candidate token, at the last
  /// measurement ("reference" too).
  std::map<std::string, double> relative_error;
  /// The same with error feedback (an auto spec with it; empty otherwise): measured on the
  /// gradient plus the residual the tensor carries, what that step compresses.
  std::map<std::string, double> relative_error_ef;
  /// With relaxed bits: whether the last choice found it in a critical regime (its budget the
  /// reference's error), the maxmin width whose error bounded its program (the reference's
  /// while critical, one fewer each calm choice since, down to the relaxed bits), and how far
  /// the norm of its gradient summed between choices had moved since the choice before, as a
  /// fraction (-1: none before).
  bool critical = true;
  int budget_bits = 0;
  double norm_change = -1;
  /// The cost model's estimate of each candidate's allreduce of this tensor, in seconds
  /// (empty without GRADCOMP_AUTO_COST_MODEL); candidates slower than none were left out.
  std::map<std::string, double> estimated_seconds;
};

/// The tensors of an auto response as adaptive compression reads them, from whoever holds them
/// (the executor, which knows each one's device and dtype).
class AutoTensors {
 public:
  virtual ~AutoTensors() = default;
  /// Whether this rank holds the response's tensor i (a rank that joined contributes zeros).
  virtual bool Has(size_t i) const = 0;
  /// Tensor i's values at `ranges` (offset, count), in order, as float32 on the host: in *keep,
  /// or a view of the tensor where it is that already.
  virtual const float* Values(size_t i, const std::vector<std::pair<size_t, size_t>>& ranges,
                              std::vector<float>* keep) = 0;
  /// Tensor i's error-feedback residual as float32 on the host (empty: none yet).
  virtual std::vector<float> Residual(size_t i) = 0;
};

/// Tensors of an auto response that run with one setting (positions in the response).
struct AutoGroup {
  CompressionSpec spec;
  bool flush = false;  ///< they moved to none with a residual: this step sends it exactly, then drops it
  std::vector<size_t> members;
};

/// Times an uncompressed allreduce of that many bytes (collective: every rank calls it at the
/// same point) and returns the seconds it took on this rank.
using ProbeUncompressed = std::function<double(size_t bytes)>;

class AutoCompression {
 public:
  /// With a `probe`, the cost model is on: a candidate estimated slower than none is left out.
  AutoCompression(Timeline& timeline, ProbeUncompressed probe = {}) : timeline_(timeline), probe_(std::move(probe)) {}
  /// Where the choices are logged (rank 0); none by default.
  void SetLogger(spdlog::logger* log) { log_ = log; }

  /// Auto's whole stage of an auto response, before it runs (background thread): counts the
  /// step of its tensors, makes the choice when one is due (collective over `world`: every
  /// rank reaches the same response), sums the regimes' samples, measures the candidates on
  /// the steps that do, and returns the tensors grouped by the setting each runs with now, in
  /// order of first appearance (the same on every rank).
  std::vector<AutoGroup> Resolve(const Response& r, AutoTensors& tensors, Communicator& world);
  /// The ranges of a tensor of n values whose sum over an interval tells its regime: up to
  /// kTrendValues values in evenly spaced blocks of 1024 (the whole tensor when smaller).
  static std::vector<std::pair<size_t, size_t>> TrendRanges(size_t n);
  static constexpr size_t kTrendValues = size_t{1} << 14;

  /// Thread-safe snapshots. (What is known of a tensor is never dropped: ForgetCompressionState
  /// is local to a rank, and choices must stay the same on every rank.)
  std::map<std::string, AutoTensorReport> Report() const;
  uint64_t choices_made() const;
  /// Tensor names it keeps counts for (background thread only).
  size_t tracked() const { return tensors_.size(); }
  /// The link as last probed (rank 0 decides with its own).
  LinkCost link() const;

 private:
  struct Tensor {
    CompressionSpec auto_spec;
    uint64_t steps = 0;
    uint64_t last_seen = 0;  // responses_ when it last ran
    bool measured = false;  // a measurement waits for the next choice
    uint64_t measured_at = 0;
    DataType dtype = DataType::kFloat32;
    size_t n = 0;
    CandidateErrors errors;  // this rank's, candidates then the reference
    int choice = -1;         // index into the spec's candidates; -1: the reference
    // Relaxed bits: the gradient at TrendRanges summed over the steps since the last choice,
    // and the norm of that sum (over ranks, scaled to the tensor) at the last choice (0: none).
    std::vector<float> trend;
    double last_norm = 0;
    int budget_bits = 0;  // the last choice's budget (a maxmin width); 0: no choice yet
    bool flush = false;
  };
  /// Counts the step of r's tensors and, when a choice is due, makes it (collective).
  void BeforeResponse(const Response& r, Communicator& world);
  /// With relaxed bits, every step of every auto tensor: adds this step's gradient at
  /// TrendRanges(n) to what each tensor accumulated since its last choice.
  void AccumulateTrends(const Response& r, AutoTensors& tensors);
  /// This rank's measurement of every tensor of r whose step measures its candidates.
  void MeasureDue(const Response& r, AutoTensors& tensors, int ranks);
  /// Whether this step of `name` measures its candidates (after BeforeResponse).
  bool Measuring(const std::string& name) const;
  /// Stores this rank's measurement of `name` (n values of dtype `dtype` on the wire).
  void Record(const std::string& name, const CompressionSpec& auto_spec, DataType dtype, size_t n,
              const CandidateErrors& errors);
  /// The setting `name` runs with now (the reference until its first choice).
  CompressionSpec SettingFor(const std::string& name, const CompressionSpec& auto_spec) const;
  /// True once after `name` moved from a compressed setting with error feedback to none:
  /// this step must send its residual.
  bool TakeFlush(const std::string& name);
  /// The settings measured for an auto spec (parsed once per spec): its candidates, then the
  /// relaxed ladder (AutoRelaxedLadder: relaxed bits > 0), then the reference.
  const std::vector<CompressionSpec>& Measured(const CompressionSpec& auto_spec);
  /// How many of Measured(auto_spec) are candidates (the first ones).
  size_t Candidates(const CompressionSpec& auto_spec);
  /// Every rank's waiting measurements summed over ranks, in name order (Choose's first step).
  struct Gathered {
    std::vector<std::string> names;
    std::vector<size_t> offset;  // where each tensor's statistics start in sums
    // Per tensor: ||x||^2, each measured setting's squared error, their codec seconds, their
    // errors with error feedback (when on), and the summed gradient's norm^2.
    std::vector<double> sums;
    std::vector<double> trend;   // the norm of each tensor's gradient summed since its last choice
    std::vector<double> change;  // how far it moved since that choice, as a fraction (-1: none)
    std::map<std::string, std::vector<size_t>> groups;  // auto spec -> positions in names
  };
  /// Rank 0's decision, broadcast: per tensor the candidate chosen and the maxmin width whose
  /// error bounded its program (flags, two each), the cost model's estimates and the log line.
  struct Decision {
    std::vector<int32_t> flags;
    std::vector<std::vector<double>> seconds;
    std::string summary;
  };
  /// One auto spec's tensors as the dynamic program sees them (weighted errors, wire bytes and
  /// budgets), with how many were critical and how many the cost model left raw.
  struct Program {
    std::vector<std::vector<double>> err2, bytes;
    std::vector<double> budget, ref_err2, ref_bytes;
    size_t in_critical = 0, raw = 0;
  };
  /// The collective choice over every tensor with a measurement waiting: gather, solve each
  /// spec's programs on rank 0, broadcast, apply.
  void Choose(Communicator& world);
  Gathered Gather(Communicator& world) const;
  /// Rank 0: the programs of one auto spec (one per budget), into d.
  void Solve(const std::string& key, const std::vector<size_t>& members, const Gathered& g, double ranks,
             const LinkCost& link, Decision& d);
  /// A spec's tensors' errors, bytes and budgets (their budget widths into d.flags), the cost
  /// model's estimates into d.seconds.
  Program BuildProgram(const std::string& key, const std::vector<size_t>& members, const Gathered& g, double ranks,
                       const LinkCost& link, Decision& d);
  /// Leaves out (an infinite error) each candidate estimated slower than none; true when none
  /// alone is left.
  static bool LeaveOutSlowerThanRaw(const std::vector<CompressionSpec>& list, size_t candidates,
                                    const std::vector<double>& seconds, std::vector<double>& err2);
  /// The log line's part on critical regimes and budgets.
  static std::string DescribeRegimes(const std::vector<size_t>& members, const Gathered& g, size_t in_critical,
                                     const std::map<std::string, int>& budgets);
  /// Every rank: the broadcast choices into each tensor's state and report.
  void Apply(const Gathered& g, const Decision& d);
  /// A tensor's measured relative errors (and estimates) into its report.
  static void RecordErrors(const std::vector<CompressionSpec>& list, size_t candidates, const double* stats,
                           const double* ef, const std::vector<double>& seconds, AutoTensorReport& rep);
  /// The timeline's AUTO_CHOICE mark of a tensor's new setting.
  void MarkChoice(const std::string& name, const Tensor& t, const std::string& token, bool with_ef,
                  AutoTensorReport& rep);
  /// Times uncompressed allreduces of two sizes (collective) and fits link_.
  void ProbeLink();
  /// Probed again every this many choices.
  static constexpr uint64_t kProbeEvery = 10;

  Timeline& timeline_;
  spdlog::logger* log_ = nullptr;
  ProbeUncompressed probe_;
  std::map<std::string, Tensor> tensors_;  // ordered: every rank walks them alike
  // Auto responses run so far. Names that stop coming (unnamed allreduces get a new name every
  // call) are forgotten once kForgetAfter of them passed without the name, checked every
  // kForgetAfter / 4: the same on every rank, since it counts the response stream.
  uint64_t responses_ = 0;
  static constexpr uint64_t kForgetAfter = 4096;
  std::map<std::string, std::vector<CompressionSpec>> measured_;  // by auto spec Describe()
  mutable std::mutex mu_;  // guards report_ and choices_
  std::map<std::string, AutoTensorReport> report_;
  uint64_t choices_ = 0;
  LinkCost link_;
};

}  // namespace gradcomp
