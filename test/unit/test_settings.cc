// Settings registry: defaults, every bad-value message, CGX aliases and their semantics.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/settings.h"
#include "ops/common/enforce.h"

namespace gradcomp {
namespace {

// Parses `vars` and returns the error message (empty when parsing succeeds).
std::string ErrorFor(const std::map<std::string, std::string>& vars) {
  try {
    Settings::FromMap(vars);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

void ExpectRejected(const std::string& var, const std::string& value, const std::string& allowed) {
  const std::string msg = ErrorFor({{var, value}});
  EXPECT_NE(msg.find(var), std::string::npos) << msg;
  EXPECT_NE(msg.find("'" + value + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(allowed), std::string::npos) << msg;
}

TEST(Settings, DefaultsComeFromTheRegistry) {
  const Settings s = Settings::FromMap({});
  EXPECT_EQ(s.compression.codec, "none");
  EXPECT_EQ(s.compression.bits, 4);
  EXPECT_EQ(s.compression.bucket_size, 512);
  EXPECT_EQ(s.min_size, 16);
  EXPECT_DOUBLE_EQ(s.fusion_threshold_mb, 64);
  EXPECT_DOUBLE_EQ(s.compression.topk_ratio, 0.01);
  EXPECT_EQ(s.inner_communicator, "shm");
  EXPECT_EQ(s.cross_communicator, "auto");
  EXPECT_EQ(s.log_level, "warning");
  EXPECT_FALSE(s.hierarchical);
  EXPECT_TRUE(s.notes.empty());
}

TEST(Settings, BadBitsAreRejectedWithVariableValueAndRange) {
  ExpectRejected("GRADCOMP_BITS", "0", "an integer in 1..8, or 32");
  ExpectRejected("GRADCOMP_BITS", "9", "an integer in 1..8, or 32");
  ExpectRejected("GRADCOMP_BITS", "abc", "an integer in 1..8, or 32");
  ExpectRejected("GRADCOMP_BITS", "4.5", "an integer in 1..8, or 32");
  ExpectRejected("GRADCOMP_BITS", "", "an integer in 1..8, or 32");
}

TEST(Settings, NegativeBucketSizeIsRejected) {
  ExpectRejected("GRADCOMP_BUCKET_SIZE", "-512", "an integer >= 1");
  ExpectRejected("GRADCOMP_BUCKET_SIZE", "0", "an integer >= 1");
}

TEST(Settings, RatioOutsideZeroOneIsRejected) {
  ExpectRejected("GRADCOMP_TOPK_RATIO", "0", "a number in (0, 1]");
  ExpectRejected("GRADCOMP_TOPK_RATIO", "1.5", "a number in (0, 1]");
  ExpectRejected("GRADCOMP_TOPK_RATIO", "-0.1", "a number in (0, 1]");
  ExpectRejected("GRADCOMP_TOPK_RATIO", "nan", "a number in (0, 1]");
  EXPECT_DOUBLE_EQ(Settings::FromMap({{"GRADCOMP_TOPK_RATIO", "1"}}).compression.topk_ratio, 1.0);
  EXPECT_DOUBLE_EQ(Settings::FromMap({{"GRADCOMP_TOPK_RATIO", "0.001"}}).compression.topk_ratio, 0.001);
}

TEST(Settings, OtherKindsAreRejectedClearly) {
  ExpectRejected("GRADCOMP_COMPRESSION", "zip", "one of none,fp16,bf16,maxmin,topk");
  ExpectRejected("GRADCOMP_HIERARCHICAL", "maybe", "0 or 1");
  ExpectRejected("GRADCOMP_FUSION_THRESHOLD_MB", "-1", "a number in [0, 65536]");
  ExpectRejected("GRADCOMP_LOG_LEVEL", "loud", "one of trace,debug,info,warning,error,fatal,off");
  ExpectRejected("GRADCOMP_LOCAL_SIZE", "-2", "an integer in 0..1000000");
  ExpectRejected("GRADCOMP_STALL_CHECK_TIME_SECONDS", "soon", "a number >= 0");
  ExpectRejected("GRADCOMP_BATCH_MIN_KB", "-1", "a number in [0, 1048576]");
  ExpectRejected("GRADCOMP_BATCH_MIN_KB", "lots", "a number in [0, 1048576]");
}

TEST(Settings, ValuesAreParsedCaseAndSpaceInsensitively) {
  const Settings s = Settings::FromMap({{"GRADCOMP_COMPRESSION", " MaxMin "},
                                        {"GRADCOMP_HIERARCHICAL", "yes"},
                                        {"GRADCOMP_BITS", "2"},
                                        {"GRADCOMP_TIMELINE", "/tmp/t.json"}});
  EXPECT_EQ(s.compression.codec, "maxmin");
  EXPECT_TRUE(s.hierarchical);
  EXPECT_EQ(s.compression.bits, 2);
  EXPECT_EQ(s.timeline, "/tmp/t.json");
}

TEST(Settings, CgxAliasesAreHonoured) {
  const Settings s = Settings::FromMap({{"CGX_COMPRESSION_BUCKET_SIZE", "128"},
                                        {"CGX_FUSION_BUFFER_SIZE_MB", "32"},
                                        {"CGX_INNER_COMMUNICATOR_TYPE", "MPI"},
                                        {"CGX_CROSS_COMMUNICATOR_TYPE", "NCCL"},
                                        {"CGX_INTRA_BROADCAST", "1"},
                                        {"CGX_COMPRESSION_SKIP_INCOMPLETE_BUCKETS", "1"}});
  EXPECT_EQ(s.compression.bucket_size, 128);
  EXPECT_DOUBLE_EQ(s.fusion_threshold_mb, 32);
  EXPECT_EQ(s.inner_communicator, "mpi");
  EXPECT_EQ(s.cross_communicator, "nccl");
  EXPECT_TRUE(s.intra_broadcast);
  EXPECT_TRUE(s.compression.skip_incomplete_buckets);
}

TEST(Settings, HorovodVariablesKeepTheirMeaning) {
  const Settings s = Settings::FromMap({{"HOROVOD_FUSION_THRESHOLD", "33554432"},  // bytes
                                        {"HOROVOD_CYCLE_TIME", "3.5"},
                                        {"HOROVOD_CACHE_CAPACITY", "0"},
                                        {"HOROVOD_HIERARCHICAL_ALLREDUCE", "1"},
                                        {"HOROVOD_TIMELINE", "/tmp/h.json"},
                                        {"HOROVOD_TIMELINE_MARK_CYCLES", "1"},
                                        {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "90"},
                                        {"HOROVOD_STALL_CHECK_DISABLE", "1"},
                                        {"HOROVOD_LOG_LEVEL", "DEBUG"},
                                        {"HOROVOD_AUTOTUNE", "1"},
                                        {"HOROVOD_CONTROLLER", "gloo"}});
  EXPECT_DOUBLE_EQ(s.fusion_threshold_mb, 32);
  EXPECT_DOUBLE_EQ(s.cycle_time_ms, 3.5);
  EXPECT_EQ(s.cache_capacity, 0);
  EXPECT_TRUE(s.hierarchical);
  EXPECT_EQ(s.timeline, "/tmp/h.json");
  EXPECT_TRUE(s.timeline_mark_cycles);
  EXPECT_DOUBLE_EQ(s.stall_shutdown_time_seconds, 90);
  EXPECT_DOUBLE_EQ(s.stall_check_time_seconds, 0);  // HOROVOD_STALL_CHECK_DISABLE
  EXPECT_EQ(s.log_level, "debug");
  EXPECT_TRUE(s.autotune);
  EXPECT_EQ(s.controller, "gloo");  // Horovod's name for its TCP controller, which the runtime reads as tcp
  EXPECT_DOUBLE_EQ(Settings::FromMap({{"HOROVOD_STALL_CHECK_TIME_SECONDS", "15"}}).stall_check_time_seconds, 15);
  // gradcomp's own variables win, and the conflict is noted.
  const Settings both = Settings::FromMap({{"HOROVOD_FUSION_THRESHOLD", "1048576"},
                                           {"GRADCOMP_FUSION_THRESHOLD_MB", "8"},
                                           {"GRADCOMP_STALL_CHECK_TIME_SECONDS", "20"},
                                           {"HOROVOD_STALL_CHECK_DISABLE", "1"}});
  EXPECT_DOUBLE_EQ(both.fusion_threshold_mb, 8);
  EXPECT_DOUBLE_EQ(both.stall_check_time_seconds, 20);
  bool noted = false;
  for (const auto& note : both.notes) {
    noted = noted || note.find("overrides HOROVOD_FUSION_THRESHOLD=1048576") != std::string::npos;
  }
  EXPECT_TRUE(noted);
  // Bad values name the Horovod variable.
  std::string msg = ErrorFor({{"HOROVOD_FUSION_THRESHOLD", "64MB"}});
  EXPECT_NE(msg.find("invalid value for HOROVOD_FUSION_THRESHOLD (Horovod's fusion threshold in bytes"),
            std::string::npos) << msg;
  msg = ErrorFor({{"HOROVOD_STALL_CHECK_DISABLE", "maybe"}});
  EXPECT_NE(msg.find("invalid value for HOROVOD_STALL_CHECK_DISABLE: 'maybe'"), std::string::npos) << msg;
  msg = ErrorFor({{"HOROVOD_CYCLE_TIME", "-1"}});
  EXPECT_NE(msg.find("HOROVOD_CYCLE_TIME (alias of GRADCOMP_CYCLE_TIME_MS)"), std::string::npos) << msg;
}

TEST(Settings, CgxBitsEnableQuantizationAndThirtyTwoDisablesIt) {
  EXPECT_EQ(Settings::FromMap({{"CGX_COMPRESSION_QUANTIZATION_BITS", "4"}}).compression.codec, "maxmin");
  EXPECT_EQ(Settings::FromMap({{"CGX_COMPRESSION_QUANTIZATION_BITS", "32"}}).compression.codec, "none");
  EXPECT_EQ(Settings::FromMap({{"GRADCOMP_COMPRESSION", "maxmin"}, {"GRADCOMP_BITS", "32"}}).compression.codec, "none");
  // An explicit compression choice is kept.
  EXPECT_EQ(Settings::FromMap({{"GRADCOMP_COMPRESSION", "topk"}, {"GRADCOMP_BITS", "4"}}).compression.codec, "topk");
  const std::string msg = ErrorFor({{"CGX_COMPRESSION_QUANTIZATION_BITS", "9"}});
  EXPECT_NE(msg.find("CGX_COMPRESSION_QUANTIZATION_BITS (alias of GRADCOMP_BITS)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'9'"), std::string::npos) << msg;
}

TEST(Settings, GradcompValueWinsOverAliasAndTheConflictIsNoted) {
  const Settings s = Settings::FromMap({{"GRADCOMP_BITS", "2"}, {"CGX_COMPRESSION_QUANTIZATION_BITS", "8"}});
  EXPECT_EQ(s.compression.bits, 2);
  ASSERT_FALSE(s.notes.empty());
  EXPECT_NE(s.notes[0].find("GRADCOMP_BITS=2 overrides CGX_COMPRESSION_QUANTIZATION_BITS=8"), std::string::npos);
  // The same value through both names is no conflict.
  const Settings same = Settings::FromMap({{"GRADCOMP_BITS", "8"}, {"CGX_COMPRESSION_QUANTIZATION_BITS", "8"}});
  for (const auto& note : same.notes) EXPECT_EQ(note.find("overrides"), std::string::npos) << note;
}

TEST(Settings, CgxMinimalSizeIsAtLeastSixteen) {
  EXPECT_EQ(Settings::FromMap({{"CGX_COMPRESSION_MINIMAL_SIZE", "0"}}).min_size, 16);
  EXPECT_EQ(Settings::FromMap({{"CGX_COMPRESSION_MINIMAL_SIZE", "4096"}}).min_size, 4096);
  EXPECT_EQ(Settings::FromMap({{"GRADCOMP_MIN_SIZE", "0"}}).min_size, 0);
}

TEST(Settings, UnknownGradcompVariablesAreNoted) {
  const Settings s = Settings::FromMap({{"GRADCOMP_BIT", "4"}});
  ASSERT_EQ(s.notes.size(), 1u);
  EXPECT_NE(s.notes[0].find("GRADCOMP_BIT is not a gradcomp setting"), std::string::npos);
  // What gcrun --elastic sets for the adapters, and what the pip build reads, are known; a typo
  // of them is not.
  const Settings elastic = Settings::FromMap({{"GRADCOMP_ELASTIC", "1"},
                                              {"GRADCOMP_ELASTIC_DIR", "/tmp/e"},
                                              {"GRADCOMP_ELASTIC_RESETS", "2"},
                                              {"GRADCOMP_CMAKE_ARGS", "-DGRADCOMP_WITH_CUDA=OFF"}});
  EXPECT_TRUE(elastic.notes.empty()) << elastic.notes[0];
  const Settings typo = Settings::FromMap({{"GRADCOMP_ELASTIC_RESET", "2"}});
  ASSERT_EQ(typo.notes.size(), 1u);
  EXPECT_NE(typo.notes[0].find("GRADCOMP_ELASTIC_RESET is not a gradcomp setting"), std::string::npos);
}

TEST(Settings, DocumentationListsEverySetting) {
  const std::string table = SettingsMarkdownTable();
  for (const SettingInfo& info : DescribeSettings()) {
    EXPECT_NE(table.find("`" + info.name + "`"), std::string::npos) << info.name;
    EXPECT_FALSE(info.help.empty()) << info.name;
    EXPECT_NO_THROW(Settings::FromMap({{info.name, info.default_value}})) << info.name;
  }
  EXPECT_NE(table.find("`CGX_INTRA_BROADCAST`"), std::string::npos);
}

TEST(Settings, EnvironmentIsRead) {
  setenv("GRADCOMP_BUCKET_SIZE", "64", 1);
  const Settings s = Settings::FromEnvironment();
  unsetenv("GRADCOMP_BUCKET_SIZE");
  EXPECT_EQ(s.compression.bucket_size, 64);
}

}  // namespace
}  // namespace gradcomp
