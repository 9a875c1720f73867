// Logging through spdlog: one logger per Runtime (no global logger), every line carrying
// the rank, at the level GRADCOMP_LOG_LEVEL names.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace gradcomp {

/// spdlog level for a GRADCOMP_LOG_LEVEL value (trace, debug, info, warning, error, fatal, off).
spdlog::level::level_enum ParseLogLevel(const std::string& level);

/// A logger printing "[time] [gradcomp rank N] [level] message" to stderr, or to `sink`
/// when given (tests capture lines this way). Not registered in spdlog's global registry,
/// so several runtimes (thread ranks) can each have one.
std::shared_ptr<spdlog::logger> MakeRankLogger(int rank, const std::string& level,
                                               spdlog::sink_ptr sink = nullptr);

}  // namespace gradcomp
