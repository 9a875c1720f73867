// Logging: every line carries the rank, and the level from settings filters lines.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <sstream>

#include "core/logging.h"
#include "ops/common/enforce.h"

namespace gradcomp {
namespace {

TEST(Logging, LinesCarryTheRankAndRespectTheLevel) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  auto logger = MakeRankLogger(3, "info", sink);
  logger->debug("hidden detail");
  logger->info("negotiated {} tensors", 5);
  logger->warn("stalled");
  logger->flush();
  const std::string text = out.str();
  EXPECT_EQ(text.find("hidden detail"), std::string::npos);
  EXPECT_NE(text.find("[gradcomp rank 3] [info] negotiated 5 tensors"), std::string::npos) << text;
  EXPECT_NE(text.find("[gradcomp rank 3] [warning] stalled"), std::string::npos) << text;
}

TEST(Logging, SeveralRanksInOneProcessKeepTheirOwnPrefix) {
  std::ostringstream a, b;
  auto la = MakeRankLogger(0, "trace", std::make_shared<spdlog::sinks::ostream_sink_mt>(a));
  auto lb = MakeRankLogger(1, "trace", std::make_shared<spdlog::sinks::ostream_sink_mt>(b));
  la->info("x");
  lb->info("y");
  EXPECT_NE(a.str().find("[gradcomp rank 0]"), std::string::npos);
  EXPECT_NE(b.str().find("[gradcomp rank 1]"), std::string::npos);
}

TEST(Logging, UnknownLevelNamesTheVariable) {
  try {
    ParseLogLevel("chatty");
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("GRADCOMP_LOG_LEVEL: 'chatty'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gradcomp
