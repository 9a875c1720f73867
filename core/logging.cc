#include "core/logging.h"

#include <spdlog/sinks/stdout_sinks.h>

#include "ops/common/enforce.h"

namespace gradcomp {

spdlog::level::level_enum ParseLogLevel(const std::string& level) {
  if (level == "trace") return spdlog::level::trace;
  if (level == "debug") return spdlog::level::debug;
  if (level == "info") return spdlog::level::info;
  if (level == "warning") return spdlog::level::warn;
  if (level == "error") return spdlog::level::err;
  if (level == "fatal") return spdlog::level::critical;
  if (level == "off") return spdlog::level::off;
  throw InvalidArgument("invalid value for GRADCOMP_LOG_LEVEL: '" + level +
                        "'; expected one of trace,debug,info,warning,error,fatal,off");
}

std::shared_ptr<spdlog::logger> MakeRankLogger(int rank, const std::string& level, spdlog::sink_ptr sink) {
  if (!sink) sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("gradcomp.rank" + std::to_string(rank), std::move(sink));
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [gradcomp rank " + std::to_string(rank) + "] [%l] %v");
  logger->set_level(ParseLogLevel(level));
  logger->flush_on(spdlog::level::warn);
  return logger;
}

}  // namespace gradcomp
