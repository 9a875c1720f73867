// The one typed registry of gradcomp's settings (NCCL param.h style): every setting has a
// GRADCOMP_* variable, a type, a default, an allowed range and a line of help, and some are
// also read from CGX's variables. Parsed once, at init.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ops/compression/spec.h"

namespace gradcomp {

/// Parsed values of every setting. Field defaults are overwritten by the registry's
/// defaults when parsing, so the registry (settings.cc) is the single source of truth.
struct Settings {
  double fusion_threshold_mb = 0;
  double cycle_time_ms = 0;
  double scheduling_credit_mb = 0;
  double batch_min_kb = 0;
  int64_t cache_capacity = 0;
  /// What tensors that pass the layer filter (min_size, more than one dimension) are
  /// compressed with; its fields are GRADCOMP_COMPRESSION, GRADCOMP_BITS, ...
  CompressionSpec compression;
  int64_t seed = 0;
  int64_t min_size = 0;
  /// GRADCOMP_ALLGATHER_COMPRESSION and its bits: the codec of float allgathers.
  std::string allgather_codec;
  int64_t allgather_bits = 0;
  bool hierarchical = false;
  int64_t local_size = 0;
  std::string inner_communicator;
  std::string cross_communicator;
  std::string controller;        // tcp | mpi | auto: what the negotiation rounds travel on
  std::string controller_iface;  // the network interface the tcp controller advertises
  bool intra_broadcast = false;
  bool cuda_data_path = true;
  int64_t shm_buffer_mb = 0;
  int64_t pipeline_stripes = 0;
  std::string uncompressed_algorithm;
  std::string compressed_algorithm;
  int64_t grid_min_ranks = 0;
  int64_t grid_node_messages = 0;
  bool auto_cost_model = true;
  bool autotune = false;
  double autotune_window_seconds = 2.0;
  std::string autotune_log;
  std::string timeline;
  bool timeline_mark_cycles = false;
  double stall_check_time_seconds = 0;
  double stall_shutdown_time_seconds = 0;
  double collective_timeout_seconds = 0;
  std::string log_level;

  /// What parsing decided that users should hear about (an alias overridden, a value
  /// adjusted as CGX documents, an unknown GRADCOMP_* variable); logged at init.
  std::vector<std::string> notes;

  /// Parses the process environment. Throws gradcomp::InvalidArgument naming the variable,
  /// the value and what is allowed.
  static Settings FromEnvironment();
  /// Parses the given variables only (init() keyword arguments, tests).
  static Settings FromMap(const std::map<std::string, std::string>& vars);
  /// Parses through `lookup` (returns nullptr when a variable is unset). `all_names` lists
  /// the variables that are set, to warn about unknown GRADCOMP_* names.
  static Settings Parse(const std::function<const char*(const std::string&)>& lookup,
                        const std::vector<std::string>& all_names);
};

/// Description of one setting, for documentation and `python3 -m gradcomp.settings`.
struct SettingInfo {
  std::string name;      ///< GRADCOMP_* variable
  std::string alias;     ///< CGX_* variable honoured too, or empty
  std::string type;      ///< bool, int, float, string or choice
  std::string default_value;
  std::string allowed;   ///< human-readable allowed values
  std::string help;
};

/// Every setting, in registry order.
std::vector<SettingInfo> DescribeSettings();

/// "NAME=value" lines of every setting that must be the same on every rank (all but the
/// per-process ones: cycle time, timeline, log level, stall times), in registry order.
std::string AgreedSettingsText(const Settings& settings);

/// How long a peer's host may acknowledge nothing on gradcomp's TCP connections before they fail
/// naming it (TcpOptions::unreachable_seconds): half the collective timeout, so that a link that
/// goes silent in the middle of a step is named before the watchdog's own verdict (which cannot
/// say which peer). 0 (the timeout disabled): the kernel's defaults.
inline double UnreachableSeconds(const Settings& settings) { return settings.collective_timeout_seconds / 2; }

/// The settings as a Markdown table (docs/settings.md is generated from it).
std::string SettingsMarkdownTable();

}  // namespace gradcomp
