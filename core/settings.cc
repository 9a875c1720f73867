#include "core/settings.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <sstream>
#include <type_traits>
#include <variant>

#include "ops/common/enforce.h"
#include "ops/compression/auto_select.h"
#include "ops/compression/codec.h"

extern char** environ;

namespace gradcomp {

namespace {

enum class Kind { kBool, kInt, kFloat, kString, kChoice };

/// Where a setting's value lives: a member of Settings, or of its default compression spec.
template <typename T>
struct Member {
  T Settings::*direct = nullptr;
  T CompressionSpec::*spec = nullptr;
  T& In(Settings& s) const { return direct != nullptr ? s.*direct : s.compression.*spec; }
  const T& In(const Settings& s) const { return direct != nullptr ? s.*direct : s.compression.*spec; }
};
using Field = std::variant<Member<bool>, Member<int32_t>, Member<int64_t>, Member<double>, Member<std::string>>;

template <typename T>
Field Of(T Settings::*member) {
  return Member<T>{member, nullptr};
}
template <typename T, typename Base>
Field Spec(T Base::*member) {
  return Member<T>{nullptr, static_cast<T CompressionSpec::*>(member)};
}

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kNoExtra = std::numeric_limits<int64_t>::min();

/// One row of the registry.
struct Entry {
  const char* name;
  const char* alias;  // the CGX or Horovod variable of the same meaning, or nullptr
  Kind kind;
  Field field;
  const char* default_value;
  const char* help;
  double lo = -kInf;  // numeric range
  double hi = kInf;
  bool lo_open = false;  // (lo, ...] instead of [lo, ...]
  int64_t extra = kNoExtra;  // one more allowed integer outside the range (bits: 32)
  const char* choices = nullptr;  // "a|b|c" for Kind::kChoice
};

// The registry. Keep it sorted by topic; docs/settings.md's table is generated from it. One table,
// an entry a setting, so one piece however long it grows.
const std::vector<Entry>& Registry() {
  static const std::vector<Entry> entries = {
      {"GRADCOMP_FUSION_THRESHOLD_MB", "CGX_FUSION_BUFFER_SIZE_MB", Kind::kFloat, Of(&Settings::fusion_threshold_mb),
       "64", "largest fusion buffer in MB; tensors ready together are packed up to this size (0 disables fusion)",
       0, 65536},
      {"GRADCOMP_CYCLE_TIME_MS", "HOROVOD_CYCLE_TIME", Kind::kFloat, Of(&Settings::cycle_time_ms), "1",
       "longest the background thread gathers newly enqueued tensors before negotiating them (less once enqueues pause or a caller waits on a handle)", 0, 10000},
      {"GRADCOMP_SCHEDULING_CREDIT_MB", nullptr, Kind::kFloat, Of(&Settings::scheduling_credit_mb), "16",
       "when ready tensors carry priorities (DistributedOptimizer's overlap_forward), each cycle runs the most "
       "urgent up to this many MB and leaves the rest for the next, so a more urgent tensor that becomes ready "
       "meanwhile goes first (0: all ready tensors every cycle)",
       0, 65536},
      {"GRADCOMP_BATCH_MIN_KB", nullptr, Kind::kFloat, Of(&Settings::batch_min_kb), "256",
       "cached tensors ready on every rank wait for more until they total this many KB, a caller blocks on a "
       "pending tensor, or they waited 16 negotiation rounds (~64 cycle times): fewer, larger collectives for "
       "models of many small tensors (0: run whatever is ready every cycle)",
       0, 1048576},
      {"GRADCOMP_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY", Kind::kInt, Of(&Settings::cache_capacity), "1024",
       "entries of the response cache that skips coordinator round trips in steady state (0 disables it)", 0,
       1e9},
      {"GRADCOMP_COMPRESSION", nullptr, Kind::kChoice, Spec(&CompressionSpec::codec), "none",
       "gradient compression of float allreduces: none, fp16, bf16, maxmin (quantization), topk (DGC) or auto (a "
       "setting per tensor among GRADCOMP_AUTO_CANDIDATES, least bytes at no more total error than maxmin with "
       "GRADCOMP_BITS etc.)",
       -kInf, kInf, false, kNoExtra, "none|fp16|bf16|maxmin|topk|auto"},
      {"GRADCOMP_BITS", "CGX_COMPRESSION_QUANTIZATION_BITS", Kind::kInt, Spec(&CompressionSpec::bits), "4",
       "bits per value for maxmin quantization; 32 disables quantization (setting it enables maxmin, as in CGX)", 1,
       8, false, 32},
      {"GRADCOMP_BUCKET_SIZE", "CGX_COMPRESSION_BUCKET_SIZE", Kind::kInt, Spec(&CompressionSpec::bucket_size), "512",
       "values per quantization bucket (each bucket has its own min and scale)", 1, 1e9},
      {"GRADCOMP_STOCHASTIC", nullptr, Kind::kBool, Spec(&CompressionSpec::stochastic), "0",
       "stochastic (unbiased) rounding in maxmin quantization instead of round-to-nearest"},
      {"GRADCOMP_SEED", nullptr, Kind::kInt, Of(&Settings::seed), "0",
       "seed of the counter-based generator used by stochastic rounding", 0, 9.2e18},
      {"GRADCOMP_SKIP_INCOMPLETE_BUCKETS", "CGX_COMPRESSION_SKIP_INCOMPLETE_BUCKETS", Kind::kBool,
       Spec(&CompressionSpec::skip_incomplete_buckets), "0", "send the last partial bucket of a tensor uncompressed"},
      {"GRADCOMP_ALLGATHER_COMPRESSION", nullptr, Kind::kChoice, Of(&Settings::allgather_codec), "none",
       "compression of float allgathers through the layer filter (GRADCOMP_MIN_SIZE), the weights FSDP unshards: "
       "none, fp16, bf16 or maxmin (GRADCOMP_ALLGATHER_BITS, buckets of GRADCOMP_BUCKET_SIZE); every rank decodes "
       "every shard, its own too, so the gathered tensors are the same on every rank",
       -kInf, kInf, false, kNoExtra, "none|fp16|bf16|maxmin"},
      {"GRADCOMP_ALLGATHER_BITS", nullptr, Kind::kInt, Of(&Settings::allgather_bits), "8",
       "bits per value of GRADCOMP_ALLGATHER_COMPRESSION=maxmin", 1, 8},
      {"GRADCOMP_MIN_SIZE", "CGX_COMPRESSION_MINIMAL_SIZE", Kind::kInt, Of(&Settings::min_size), "16",
       "tensors with fewer elements are sent uncompressed (via the CGX variable at least 16, as CGX does)", 0,
       9.2e18},
      {"GRADCOMP_TOPK_RATIO", nullptr, Kind::kFloat, Spec(&CompressionSpec::topk_ratio), "0.01",
       "fraction of values topk (DGC) keeps per tensor", 0, 1, true},
      {"GRADCOMP_TOPK_MOMENTUM", nullptr, Kind::kFloat, Spec(&CompressionSpec::topk_momentum), "0",
       "DGC momentum correction for topk: momentum kept per tensor and masked where values were sent (0: off; "
       "run the optimizer without momentum then)",
       0, 0.999999},
      {"GRADCOMP_TOPK_NESTEROV", nullptr, Kind::kBool, Spec(&CompressionSpec::topk_nesterov), "0",
       "Nesterov variant of DGC's momentum correction"},
      {"GRADCOMP_ERROR_FEEDBACK", nullptr, Kind::kBool, Spec(&CompressionSpec::error_feedback), "0",
       "carry each tensor's compression error into its next step (error feedback)"},
      {"GRADCOMP_AUTO_CANDIDATES", nullptr, Kind::kString, Spec(&CompressionSpec::auto_candidates),
       "none,fp16,maxmin8,maxmin6,maxmin5,maxmin4,maxmin3,maxmin2,maxmin1",
       "with GRADCOMP_COMPRESSION=auto, the settings chosen from per tensor: none, fp16, bf16, maxminB (B in 1..8), "
       "topkR (R in (0, 1]), comma-separated"},
      {"GRADCOMP_AUTO_COST_MODEL", nullptr, Kind::kBool, Of(&Settings::auto_cost_model), "1",
       "with GRADCOMP_COMPRESSION=auto, a tensor is compressed only where that is estimated to save time: timed "
       "uncompressed allreduces of one value and of two sizes give the link's latency and cost per byte, the "
       "candidates' encoding and decoding are timed on the gradients"},
      {"GRADCOMP_AUTO_INTERVAL", nullptr, Kind::kInt, Spec(&CompressionSpec::auto_interval), "25",
       "with GRADCOMP_COMPRESSION=auto, steps between two choices (each choice measures every candidate on the "
       "step before it)",
       1, 1e9},
      {"GRADCOMP_AUTO_RELAXED_BITS", nullptr, Kind::kInt, Spec(&CompressionSpec::auto_relaxed_bits), "2",
       "with GRADCOMP_COMPRESSION=auto, the error budget outside critical regimes: a calm tensor's steps down one bit "
       "a choice, from the reference's to that of maxmin at these bits (fewer than the reference's; 0: the "
       "reference's budget at every step; by default 2, lowered to 1 by DistributedOptimizer under an optimizer that "
       "normalizes its update per coordinate, Adam and its kin, and never at or above the reference's bits)",
       0, 8},
      {"GRADCOMP_AUTO_CRITICAL_CHANGE", nullptr, Kind::kFloat, Spec(&CompressionSpec::auto_critical_change), "0.5",
       "with GRADCOMP_AUTO_RELAXED_BITS, a tensor is in a critical regime (the reference's budget) while its gradient "
       "summed over an interval moved in norm by at least this fraction since the previous choice (Accordion's eta)",
       1e-6, 1e6},
      {"GRADCOMP_AUTO_NORMALIZED", nullptr, Kind::kBool, Spec(&CompressionSpec::auto_normalized), "1",
       "with GRADCOMP_COMPRESSION=auto, each tensor's error is weighed over its values' mean square (the error of an "
       "update normalized per coordinate, which held SGD's and Adam's accuracy alike) instead of absolute (0)"},
      {"GRADCOMP_HIERARCHICAL", "HOROVOD_HIERARCHICAL_ALLREDUCE", Kind::kBool, Of(&Settings::hierarchical), "0",
       "allreduce inside each node first (shared memory), then across nodes"},
      {"GRADCOMP_LOCAL_SIZE", nullptr, Kind::kInt, Of(&Settings::local_size), "0",
       "force nodes of this many consecutive ranks (0 detects them); lets one machine exercise hierarchy", 0,
       1e6},
      {"GRADCOMP_INNER_COMMUNICATOR", "CGX_INNER_COMMUNICATOR_TYPE", Kind::kChoice, Of(&Settings::inner_communicator),
       "shm",
       "transport between ranks of one node in hierarchical operations (nccl: for GPU tensors, in a build with "
       "NCCL)",
       -kInf, kInf, false, kNoExtra,
       "shm|mpi|nccl"},
      {"GRADCOMP_CROSS_COMMUNICATOR", "CGX_CROSS_COMMUNICATOR_TYPE", Kind::kChoice, Of(&Settings::cross_communicator),
       "auto",
       "transport of host tensors between nodes: tcp (gradcomp's own connections, the tcp controller's: a rank "
       "waiting for a peer's bytes sleeps in poll() until they arrive, where over MPI it polls; with one rank per "
       "node the whole world moves onto them), mpi, auto (tcp when the controller's connections are up, the job "
       "spans several nodes and MPI is not CUDA-aware, else mpi); nccl: GPU tensors over NCCL (a build with NCCL), "
       "host tensors over MPI",
       -kInf, kInf, false, kNoExtra, "auto|tcp|mpi|nccl"},
      {"GRADCOMP_CONTROLLER", "HOROVOD_CONTROLLER", Kind::kChoice, Of(&Settings::controller), "auto",
       "what the negotiation rounds (and the agreement before each cycle's collectives) travel on: tcp (connections "
       "of gradcomp's own, on which a rank waiting for a late peer sleeps until its bytes arrive), mpi (the world "
       "communicator, polled), auto (tcp when the world is MPI's and spans several ranks, falling back to mpi with "
       "a warning when the ranks cannot connect); gloo, Horovod's name for its TCP controller, means tcp",
       -kInf, kInf, false, kNoExtra, "auto|tcp|mpi|gloo"},
      {"GRADCOMP_CONTROLLER_IFACE", "HOROVOD_GLOO_IFACE", Kind::kString, Of(&Settings::controller_iface), "",
       "the network interface whose IPv4 addresses gradcomp's TCP connections (the controller's, and the data's "
       "between nodes under GRADCOMP_CROSS_COMMUNICATOR auto or tcp) use, comma-separated (empty: every interface "
       "that is up, the fastest ordinary ones first, container bridges such as docker0 after, loopback last; a peer "
       "on another host is dialed first on an address of a network this host is on, last on one of this host's own "
       "addresses; one on the same host on 127.0.0.1 first); gcrun --network-interface sets it"},
      {"GRADCOMP_INTRA_BROADCAST", "CGX_INTRA_BROADCAST", Kind::kBool, Of(&Settings::intra_broadcast), "0",
       "in hierarchical operations only one rank per node crosses the network, then broadcasts in the node"},
      {"GRADCOMP_CUDA_DATA_PATH", nullptr, Kind::kBool, Of(&Settings::cuda_data_path), "1",
       "GPU tensors stay on the GPU (encode, reduce, decode there; only encoded bytes staged) in builds with CUDA; 0 "
       "stages whole tensors through host memory"},
      {"GRADCOMP_SHM_BUFFER_MB", nullptr, Kind::kInt, Of(&Settings::shm_buffer_mb), "16",
       "size of each rank's staging area in the node's shared-memory window", 1, 4096},
      {"GRADCOMP_PIPELINE_STRIPES", nullptr, Kind::kInt, Of(&Settings::pipeline_stripes), "0",
       "compressed allreduces of 1M+ values go in at least this many stripes (about 1 MB on the wire each) "
       "whose encoding overlaps the network (0: 4 for allreduces that cross nodes, else none; 1: off)",
       0, 64},
      {"GRADCOMP_UNCOMPRESSED_ALGORITHM", nullptr, Kind::kChoice, Of(&Settings::uncompressed_algorithm), "auto",
       "uncompressed allreduces: mpi (MPI_Allreduce, or shared memory in a node), sra (gradcomp's scatter-reduce-"
       "allgather over point-to-point, float32 sum/average), auto (sra for float32 sum/average of 256 KB or more "
       "when the world spans nodes, hierarchical on nodes of several ranks; else mpi); uncompressed reducescatters "
       "and allgathers of host tensors sum and gather inside each node first on nodes of several ranks, except "
       "under mpi",
       -kInf, kInf, false, kNoExtra, "auto|mpi|sra"},
      {"GRADCOMP_COMPRESSED_ALGORITHM", nullptr, Kind::kChoice, Of(&Settings::compressed_algorithm), "auto",
       "the SRA of dense compressed (and gradcomp's uncompressed) allreduces across ranks or, hierarchical, across "
       "nodes: sra (flat: 2 (n-1) messages a rank), sra2d (a grid of rows and columns: 2 (rows + columns - 2) "
       "messages, one more quantization; on nodes of several ranks the rows are the nodes, and the columns across "
       "nodes run a grid of their own from GRADCOMP_GRID_MIN_RANKS nodes on, one quantization more again), auto "
       "(sra2d on nodes of several ranks, else from GRADCOMP_GRID_MIN_RANKS ranks on); compressed reducescatters and "
       "allgathers on nodes of several ranks sum or gather inside the node first unless this is sra",
       -kInf, kInf, false, kNoExtra, "auto|sra|sra2d"},
      {"GRADCOMP_GRID_MIN_RANKS", nullptr, Kind::kInt, Of(&Settings::grid_min_ranks), "32",
       "with GRADCOMP_COMPRESSED_ALGORITHM=auto, the number of ranks the SRA spans from which it runs on a grid",
       4, 1 << 20},
      {"GRADCOMP_GRID_NODE_MESSAGES", nullptr, Kind::kInt, Of(&Settings::grid_node_messages), "128",
       "the most messages a node's ranks together post at once in a row step of a grid across nodes: its rows are "
       "at most this over the ranks a node long, and a column longer than that and at least GRADCOMP_GRID_MIN_RANKS "
       "runs a grid of its own (1024 nodes of 8 ranks: rows of 16 nodes, their 64-node columns on 8 x 8 grids)",
       2, 1 << 20},
      {"GRADCOMP_AUTOTUNE", "HOROVOD_AUTOTUNE", Kind::kBool, Of(&Settings::autotune), "0",
       "tune the fusion threshold and the cycle time while training: rank 0 scores each by the bytes reduced per "
       "second over a window, every threshold then every cycle time, keeps the best and logs each score"},
      {"GRADCOMP_AUTOTUNE_WINDOW_SECONDS", nullptr, Kind::kFloat, Of(&Settings::autotune_window_seconds), "2",
       "with GRADCOMP_AUTOTUNE, seconds of training each candidate setting is scored over (after as long to settle)",
       0, 3600, true},
      {"GRADCOMP_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_LOG", Kind::kString, Of(&Settings::autotune_log), "",
       "with GRADCOMP_AUTOTUNE, rank 0 writes each scored setting to this CSV file"},
      {"GRADCOMP_TIMELINE", "HOROVOD_TIMELINE", Kind::kString, Of(&Settings::timeline), "",
       "write a Chrome-trace timeline of every operation to this file (empty: off)"},
      {"GRADCOMP_TIMELINE_MARK_CYCLES", "HOROVOD_TIMELINE_MARK_CYCLES", Kind::kBool,
       Of(&Settings::timeline_mark_cycles), "0",
       "mark each background-thread cycle in the timeline"},
      {"GRADCOMP_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_CHECK_TIME_SECONDS", Kind::kFloat,
       Of(&Settings::stall_check_time_seconds), "60",
       "warn, naming the missing ranks, when a tensor waits this long for other ranks (0 disables)", 0, 1e9},
      {"GRADCOMP_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", Kind::kFloat,
       Of(&Settings::stall_shutdown_time_seconds), "0",
       "fail a tensor on every rank once it has waited this long (0 disables)", 0, 1e9},
      {"GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS", nullptr, Kind::kFloat, Of(&Settings::collective_timeout_seconds), "600",
       "end the process (status 1, naming what waited) when init, a negotiation round or a collective has not "
       "completed after this long: a peer rank died, stopped or lost its link (0: wait forever); gradcomp's TCP "
       "connections fail, naming the peer, once its host acknowledged nothing for half of it", 0, 1e9},
      {"GRADCOMP_LOG_LEVEL", "HOROVOD_LOG_LEVEL", Kind::kChoice, Of(&Settings::log_level), "warning",
       "least severe log level printed", -kInf, kInf, false, kNoExtra,
       "trace|debug|info|warning|error|fatal|off"},
  };
  return entries;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string Trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\n\r");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\n\r");
  return s.substr(b, e - b + 1);
}

std::string FormatNumber(double v) {
  if (v == kInf) return "inf";
  if (v == -kInf) return "-inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string KindName(Kind kind) {
  switch (kind) {
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "string";
    case Kind::kChoice: return "choice";
  }
  return "?";
}

std::string Allowed(const Entry& e) {
  switch (e.kind) {
    case Kind::kBool: return "0 or 1 (also true/false, yes/no, on/off)";
    case Kind::kString: return "any text";
    case Kind::kChoice: {
      std::string c = e.choices;
      std::replace(c.begin(), c.end(), '|', ',');
      return "one of " + c;
    }
    case Kind::kInt: {
      std::string s = "an integer in " + FormatNumber(e.lo) + ".." + FormatNumber(e.hi);
      if (e.hi >= 1e9) s = "an integer >= " + FormatNumber(e.lo);
      if (e.extra != kNoExtra) s += ", or " + std::to_string(e.extra);
      return s;
    }
    case Kind::kFloat: {
      if (e.lo_open) return "a number in (" + FormatNumber(e.lo) + ", " + FormatNumber(e.hi) + "]";
      if (e.hi >= 1e9) return "a number >= " + FormatNumber(e.lo);
      return "a number in [" + FormatNumber(e.lo) + ", " + FormatNumber(e.hi) + "]";
    }
  }
  return "";
}

[[noreturn]] void Reject(const Entry& e, const std::string& variable, const std::string& value) {
  std::string who = variable;
  if (variable != e.name) who += std::string(" (alias of ") + e.name + ")";
  throw InvalidArgument("invalid value for " + who + ": '" + value + "'; expected " + Allowed(e) + " (" +
                        e.help + ")");
}

bool ParseBool(const std::string& v, bool* out) {
  const std::string s = Lower(v);
  if (s == "1" || s == "true" || s == "yes" || s == "on") return *out = true, true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return *out = false, true;
  return false;
}

bool InRange(const Entry& e, double x) {
  const bool lo_ok = e.lo_open ? x > e.lo : x >= e.lo;
  return lo_ok && x <= e.hi;
}

// Parses `raw` for entry `e` (read from `variable`) into `s`; throws on a bad value.
void Assign(const Entry& e, const std::string& variable, const std::string& raw, Settings* s) {
  const std::string v = Trim(raw);
  switch (e.kind) {
    case Kind::kBool: {
      bool b = false;
      if (!ParseBool(v, &b)) Reject(e, variable, raw);
      std::get<Member<bool>>(e.field).In(*s) = b;
      return;
    }
    case Kind::kInt: {
      errno = 0;
      char* end = nullptr;
      const long long x = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || errno == ERANGE) Reject(e, variable, raw);
      if (!InRange(e, static_cast<double>(x)) && x != e.extra) Reject(e, variable, raw);
      std::visit(
          [&](const auto& m) {
            using T = std::decay_t<decltype(m.In(*s))>;
            if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) m.In(*s) = static_cast<T>(x);
          },
          e.field);
      return;
    }
    case Kind::kFloat: {
      errno = 0;
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(x) || !InRange(e, x)) {
        Reject(e, variable, raw);
      }
      std::get<Member<double>>(e.field).In(*s) = x;
      return;
    }
    case Kind::kChoice: {
      const std::string want = Lower(v);
      std::stringstream choices(e.choices);
      for (std::string c; std::getline(choices, c, '|');) {
        if (c == want) {
          std::get<Member<std::string>>(e.field).In(*s) = c;
          return;
        }
      }
      Reject(e, variable, raw);
    }
    case Kind::kString:
      std::get<Member<std::string>>(e.field).In(*s) = raw;
      return;
  }
}

bool Same(const Entry& e, const std::string& a, const std::string& b) {
  Settings x, y;
  Assign(e, e.name, a, &x);
  Assign(e, e.name, b, &y);
  return std::visit([&](const auto& m) { return m.In(x) == m.In(y); }, e.field);
}

// Horovod's variables whose meaning needs a conversion (the others are aliases in the registry).
void ReadHorovodConversions(const std::function<const char*(const std::string&)>& lookup,
                            const std::set<std::string>& explicitly_set, Settings& s) {
  if (const char* bytes = lookup("HOROVOD_FUSION_THRESHOLD"); bytes != nullptr) {
    double b = -1;
    std::istringstream in(bytes);
    in >> b;
    if (!in || !in.eof() || !(b >= 0) || b > 65536.0 * 1048576) {
      throw InvalidArgument(std::string("invalid value for HOROVOD_FUSION_THRESHOLD (Horovod's fusion threshold in "
                                        "bytes, read as GRADCOMP_FUSION_THRESHOLD_MB): '") + bytes +
                            "'; expected a number of bytes in [0, 65536 MB]");
    }
    if (explicitly_set.count("GRADCOMP_FUSION_THRESHOLD_MB")) {
      s.notes.push_back("GRADCOMP_FUSION_THRESHOLD_MB (or CGX_FUSION_BUFFER_SIZE_MB) overrides "
                        "HOROVOD_FUSION_THRESHOLD=" + std::string(bytes));
    } else {
      s.fusion_threshold_mb = b / 1048576.0;
    }
  }
  if (const char* off = lookup("HOROVOD_STALL_CHECK_DISABLE"); off != nullptr) {
    bool disable = false;
    if (!ParseBool(off, &disable)) {
      throw InvalidArgument(std::string("invalid value for HOROVOD_STALL_CHECK_DISABLE: '") + off +
                            "'; expected 0 or 1 (also true/false, yes/no, on/off)");
    }
    if (disable && !explicitly_set.count("GRADCOMP_STALL_CHECK_TIME_SECONDS")) s.stall_check_time_seconds = 0;
  }
}

// CGX's semantics of the bits, and the defaults that follow the settings given.
void ApplyCgxSemantics(const std::set<std::string>& explicitly_set, const std::set<std::string>& from_alias,
                       Settings& s) {
  // CGX semantics: choosing a bit width below 32 turns quantization on, 32 turns it off.
  CompressionSpec& c = s.compression;
  if (!explicitly_set.count("GRADCOMP_COMPRESSION") && explicitly_set.count("GRADCOMP_BITS") && c.bits < 32) {
    c.codec = "maxmin";
    s.notes.push_back("compression set to maxmin because " + std::to_string(c.bits) + " bits were requested");
  }
  if (LookupCodec(c.codec) == &MaxMinCodec() && c.bits == 32) {
    c.codec = "none";
    s.notes.push_back("maxmin with 32 bits means no quantization: compression set to none");
  }
  // The default relaxed bits (2) under a reference of 2 bits or 1: one fewer than the reference's, or off.
  if (!explicitly_set.count("GRADCOMP_AUTO_RELAXED_BITS") && c.auto_relaxed_bits >= c.bits) {
    c.auto_relaxed_bits = std::max(0, c.bits - 1);
  }
  if (c.is_auto()) ValidateSpec(c, "GRADCOMP_COMPRESSION=auto (GRADCOMP_AUTO_CANDIDATES, GRADCOMP_BITS, ...)");
  // CGX documents that its minimal size is never below 16.
  if (from_alias.count("GRADCOMP_MIN_SIZE") && s.min_size < 16) {
    s.notes.push_back("CGX_COMPRESSION_MINIMAL_SIZE=" + std::to_string(s.min_size) + " raised to 16, as CGX does");
    s.min_size = 16;
  }
}

// Notes every GRADCOMP_ variable that is not a setting (a typo, most likely).
void NoteUnknownNames(const std::vector<std::string>& all_names, Settings& s) {
  // Besides the settings: what gradcomp's own launcher sets for its adapters (gcrun --elastic:
  // launcher/elastic.py, read by gradcomp/elastic.py), which the runtime does not read, and what
  // its pip build reads (setup.py; docs/install.md), which a user may keep exported.
  std::set<std::string> known = {"GRADCOMP_ELASTIC", "GRADCOMP_ELASTIC_DIR", "GRADCOMP_ELASTIC_RESETS",
                                 "GRADCOMP_CMAKE_ARGS"};
  for (const Entry& e : Registry()) known.insert(e.name);
  for (const std::string& name : all_names) {
    if (name.rfind("GRADCOMP_", 0) == 0 && !known.count(name)) {
      s.notes.push_back(name + " is not a gradcomp setting and is ignored (docs/settings.md lists every setting)");
    }
  }
}

}  // namespace

Settings Settings::Parse(const std::function<const char*(const std::string&)>& lookup,
                         const std::vector<std::string>& all_names) {
  Settings s;
  std::set<std::string> explicitly_set;
  std::set<std::string> from_alias;
  for (const Entry& e : Registry()) {
    Assign(e, e.name, e.default_value, &s);
    const char* primary = lookup(e.name);
    const char* alias = e.alias ? lookup(e.alias) : nullptr;
    if (alias != nullptr) Assign(e, e.alias, alias, &s);  // validated even when overridden
    if (primary != nullptr) {
      if (alias != nullptr && !Same(e, primary, alias)) {
        s.notes.push_back(std::string(e.name) + "=" + primary + " overrides " + e.alias + "=" + alias);
      }
      Assign(e, e.name, primary, &s);
    } else if (alias != nullptr) {
      from_alias.insert(e.name);
    }
    if (primary != nullptr || alias != nullptr) explicitly_set.insert(e.name);
  }

  ReadHorovodConversions(lookup, explicitly_set, s);
  ApplyCgxSemantics(explicitly_set, from_alias, s);
  NoteUnknownNames(all_names, s);
  return s;
}

Settings Settings::FromEnvironment() {
  std::vector<std::string> names;
  for (char** env = environ; env != nullptr && *env != nullptr; ++env) {
    const std::string kv = *env;
    names.push_back(kv.substr(0, kv.find('=')));
  }
  return Parse([](const std::string& name) { return std::getenv(name.c_str()); }, names);
}

Settings Settings::FromMap(const std::map<std::string, std::string>& vars) {
  std::vector<std::string> names;
  for (const auto& kv : vars) names.push_back(kv.first);
  return Parse(
      [&vars](const std::string& name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      },
      names);
}

std::vector<SettingInfo> DescribeSettings() {
  std::vector<SettingInfo> out;
  for (const Entry& e : Registry()) {
    out.push_back({e.name, e.alias ? e.alias : "", KindName(e.kind), e.default_value, Allowed(e), e.help});
  }
  return out;
}

std::string AgreedSettingsText(const Settings& settings) {
  // Settings a rank may choose for itself; every other one shapes the collective sequence or
  // the bytes on the wire, so ranks that disagree would deadlock or mix incompatible data.
  static const std::set<std::string> kPerProcess = {
      "GRADCOMP_CYCLE_TIME_MS", "GRADCOMP_TIMELINE", "GRADCOMP_TIMELINE_MARK_CYCLES", "GRADCOMP_LOG_LEVEL",
      "GRADCOMP_STALL_CHECK_TIME_SECONDS", "GRADCOMP_STALL_SHUTDOWN_TIME_SECONDS",
      "GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS", "GRADCOMP_AUTOTUNE_LOG", "GRADCOMP_CONTROLLER_IFACE"};
  std::string out;
  for (const Entry& e : Registry()) {
    if (kPerProcess.count(e.name)) continue;
    const std::string value = std::visit(
        [&](const auto& m) -> std::string {
          const auto& v = m.In(settings);
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) {
            return v;
          } else {
            return std::to_string(v);
          }
        },
        e.field);
    out += std::string(e.name) + "=" + value + "\n";
  }
  return out;
}

std::string SettingsMarkdownTable() {
  std::ostringstream os;
  os << "| variable | CGX / Horovod alias | default | allowed | meaning |\n|---|---|---|---|---|\n";
  for (const SettingInfo& i : DescribeSettings()) {
    os << "| `" << i.name << "` | " << (i.alias.empty() ? "" : "`" + i.alias + "`") << " | `"
       << i.default_value << "` | " << i.allowed << " | " << i.help << " |\n";
  }
  return os.str();
}

}  // namespace gradcomp
