// Pieces of the controller in isolation: message encoding, fusion planning, the response
// cache (hits, mismatches, LRU eviction), the stall inspector and the tensor queue's burst
// gathering.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/fusion.h"
#include "core/message.h"
#include "core/response_cache.h"
#include "core/stall_inspector.h"
#include "core/tensor_queue.h"
#include "core/timeline.h"
#include "ops/common/enforce.h"

namespace gradcomp {
namespace {

Response Allreduce(const std::string& name, int64_t n, DataType dt = DataType::kFloat32, ReduceOp op = ReduceOp::kSum) {
  Response r;
  r.type = RequestType::kAllreduce;
  r.names = {name};
  r.dtype = dt;
  r.op = op;
  r.shapes = {{n}};
  return r;
}

Request RequestFor(const Response& r, int rank) {
  Request q;
  q.rank = rank;
  q.type = r.type;
  q.name = r.names[0];
  q.dtype = r.dtype;
  q.op = r.op;
  q.shape = r.shapes[0];
  return q;
}

TEST(Messages, RequestsAndResponsesRoundTrip) {
  Request q;
  q.rank = 3;
  q.type = RequestType::kAlltoall;
  q.name = "layer.0/weight";
  q.dtype = DataType::kBFloat16;
  q.shape = {4, 5, 6};
  q.op = ReduceOp::kMax;
  q.root = 2;
  q.prescale = 0.5;
  q.postscale = 3;
  q.compression.codec = "maxmin";
  q.compression.bits = 3;
  q.splits = {1, 3};
  q.on_device = true;
  const std::vector<Request> back = ParseRequests(SerializeRequests({q, Request()}));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_TRUE(back[0].on_device);
  EXPECT_FALSE(back[1].on_device);
  EXPECT_EQ(back[0].name, q.name);
  EXPECT_EQ(back[0].shape, q.shape);
  EXPECT_EQ(back[0].splits, q.splits);
  EXPECT_EQ(back[0].compression, q.compression);
  EXPECT_EQ(back[0].dtype, q.dtype);
  EXPECT_EQ(back[0].postscale, 3.0);
  Response r = Allreduce("a", 7);
  r.error = "boom";
  r.rank_dims = {1, 2, 3};
  r.last_joined = 1;
  r.on_device = true;
  const std::vector<Response> rb = ParseResponses(SerializeResponses({r}));
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_TRUE(rb[0].on_device);
  EXPECT_TRUE(r.Single(0).on_device);
  EXPECT_EQ(rb[0].error, "boom");
  EXPECT_EQ(rb[0].rank_dims, r.rank_dims);
  EXPECT_EQ(rb[0].shapes, r.shapes);
  EXPECT_THROW(ParseRequests(SerializeRequests({q}).substr(0, 20)), Error);
}

// What the fuzzer found: a corrupt count or enum byte is rejected, naming it, before anything
// is allocated for it.
// Sets one field of a message to a value other than its default.
struct Perturb {
  template <typename T>
  void operator()(T& v) const {
    if constexpr (std::is_same_v<T, bool>) {
      v = !v;
    } else if constexpr (std::is_enum_v<T>) {
      v = static_cast<T>(static_cast<std::underlying_type_t<T>>(v) + 1);
    } else if constexpr (std::is_arithmetic_v<T>) {
      v = v + 2;
    } else if constexpr (std::is_same_v<T, std::string>) {
      v = "field";
    } else if constexpr (std::is_same_v<T, CompressionSpec>) {
      v.codec = "maxmin";
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      v.push_back("name");
    } else if constexpr (std::is_same_v<T, std::vector<std::vector<int64_t>>>) {
      v.push_back({3, 4});
    } else {
      v.push_back(5);
    }
  }
};

// Each field of the message's list, set alone: it changes the bytes and comes back (the bytes
// of what was read are the bytes written), so a field added to the list is sent and read.
template <typename M, typename Serialize, typename Parse>
void ExpectEveryFieldTravels(Serialize serialize, Parse parse) {
  size_t fields = 0;
  const M fresh;
  M::ForEachField(fresh, [&](const auto&) { ++fields; });
  const std::string plain = serialize(std::vector<M>{M()});
  for (size_t k = 0; k < fields; ++k) {
    M m;
    size_t at = 0;
    M::ForEachField(m, [&](auto& v) {
      if (at++ == k) Perturb()(v);
    });
    const std::string bytes = serialize(std::vector<M>{m});
    EXPECT_NE(bytes, plain) << "field " << k << " is not written";
    EXPECT_EQ(serialize(parse(bytes)), bytes) << "field " << k << " is not read back";
  }
  EXPECT_GE(fields, 13u);
}

TEST(Messages, EveryFieldOfTheListIsSentAndRead) {
  ExpectEveryFieldTravels<Request>(SerializeRequests, ParseRequests);
  ExpectEveryFieldTravels<Response>(SerializeResponses, ParseResponses);
}

TEST(Messages, CorruptCountsAndEnumsAreRejectedWithWhatIsWrong) {
  const auto expect_error = [](const std::function<void()>& parse, const std::string& text) {
    try {
      parse();
      ADD_FAILURE() << "no error; expected one containing: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  std::string huge(8, '\0');
  const uint64_t count = uint64_t{1} << 60;
  std::memcpy(&huge[0], &count, 8);
  expect_error([&] { ParseRequests(huge); }, "a list of 1152921504606846976 items at byte 8 cannot fit in the 0 bytes left");
  expect_error([&] { ParseResponses(huge + std::string(100, '\0')); }, "cannot fit in the 100 bytes left");
  Request q;
  q.name = "w";
  std::string bytes = SerializeRequests({q});
  bytes[8 + 4] = 9;  // the request type, after the count and the rank
  expect_error([&] { ParseRequests(bytes); }, "request type 9 at byte 12 is not one of the 7 known");
  Response r;
  r.names = {"w"};
  std::string rbytes = SerializeResponses({r});
  // Shape-list count of the response: after type, error, names, dtype, op, root, scales, spec
  // (its fields in CompressionOptions::ForEach order, the last four auto's interval, relaxed
  // bits, critical change and normalized).
  const size_t spec =
      (8 + 4) + 4 + 8 + 1 + 1 + 1 + 8 + 8 + 1 + (8 + r.compression.auto_candidates.size()) + 8 + 4 + 8 + 1;
  const size_t at = 8 + 1 + 8 + 8 + (8 + 1) + 1 + 1 + 4 + 8 + 8 + spec;
  std::memcpy(&rbytes[at], &count, 8);
  expect_error([&] { ParseResponses(rbytes); },
               "a list of 1152921504606846976 items at byte " + std::to_string(at + 8) + " cannot fit");
}

TEST(Fusion, FusesCompatibleTensorsUpToTheThreshold) {
  std::vector<Response> in;
  for (int i = 0; i < 10; ++i) in.push_back(Allreduce("f" + std::to_string(i), 256));  // 1 KB each
  in.push_back(Allreduce("d", 256, DataType::kFloat64));
  in.push_back(Allreduce("max", 256, DataType::kFloat32, ReduceOp::kMax));
  Response scaled = Allreduce("scaled", 256);
  scaled.postscale = 0.5;
  in.push_back(scaled);
  Response compressed = Allreduce("q", 256);
  compressed.compression.codec = "maxmin";
  in.push_back(compressed);
  Response bcast = Allreduce("b", 256);
  bcast.type = RequestType::kBroadcast;
  in.push_back(bcast);
  Response device = Allreduce("dev", 256);  // in device memory: not fused with host tensors
  device.on_device = true;
  in.push_back(device);

  const std::vector<Response> out = FuseResponses(in, 4096);  // 4 float32 tensors per buffer
  ASSERT_EQ(out.size(), 3u + 6u);
  EXPECT_EQ(out[0].names, (std::vector<std::string>{"f0", "f1", "f2", "f3"}));
  EXPECT_EQ(out[1].names, (std::vector<std::string>{"f4", "f5", "f6", "f7"}));
  EXPECT_EQ(out[2].names, (std::vector<std::string>{"f8", "f9"}));
  for (size_t i = 3; i < out.size(); ++i) EXPECT_EQ(out[i].names.size(), 1u) << out[i].names[0];
  EXPECT_EQ(FuseResponses(in, 0).size(), in.size());  // 0 disables fusion
  // A tensor larger than the threshold travels alone.
  EXPECT_EQ(FuseResponses({Allreduce("big", 1 << 20), Allreduce("s", 1)}, 4096).size(), 2u);
  // The planner fed with references (the controller's cache) plans the same, copying.
  FusionPlanner planner(4096);
  for (const Response& r : in) planner.Add(r);
  const std::vector<Response> by_reference = planner.Take();
  ASSERT_EQ(by_reference.size(), out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(by_reference[i].names, out[i].names);
    EXPECT_EQ(by_reference[i].shapes, out[i].shapes);
  }
  EXPECT_EQ(in[0].names, std::vector<std::string>{"f0"});  // inputs left alone
  EXPECT_TRUE(planner.Take().empty());
}

TEST(Fusion, LargeTensorsGoAloneWhereTheyLie) {
  // Under a 64 MB threshold: the 16 MiB gradient is not copied into a fusion buffer with its
  // 40 KB neighbours, which still fuse; in device memory alike (the same bytes on the wire).
  const int64_t threshold = int64_t{64} << 20;
  const int64_t large = kAloneBytes / 4;  // float32 values
  for (bool on_device : {false, true}) {
    std::vector<Response> in = {Allreduce("a", 10240), Allreduce("big", large), Allreduce("b", 10240)};
    for (Response& r : in) r.on_device = on_device;
    const std::vector<Response> out = FuseResponses(in, threshold);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].names, (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(out[1].names, std::vector<std::string>{"big"});
  }
  EXPECT_EQ(FuseResponses({Allreduce("x", large - 1), Allreduce("y", 1)}, threshold).size(), 1u);
  EXPECT_EQ(FuseResponses({Allreduce("x", large), Allreduce("y", 1)}, threshold).size(), 2u);
}

TEST(TensorQueue, BurstEndsWhenACallerBlocksOrThePushesStop) {
  auto queue = std::make_shared<TensorQueue>();
  const auto push = [&](const std::string& name) {
    Request r;
    r.name = name;
    TensorEntry e;
    e.handle = std::make_shared<Handle>(std::weak_ptr<WaitObserver>(queue));
    std::shared_ptr<Handle> handle = e.handle;
    queue->Push(r, std::move(e));
    return handle;
  };
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  // Quiet time and limit of a minute: only the blocked caller can end the gathering early.
  std::shared_ptr<Handle> h = push("a");
  std::thread caller([&] { EXPECT_FALSE(h->WaitFor(0.3)); });
  const auto t0 = Clock::now();
  queue->WaitForBurstEnd(std::chrono::seconds(60), std::chrono::seconds(60));
  EXPECT_LT(seconds_since(t0), 30.0);
  caller.join();
  // No caller blocked: the gathering ends once pushes stop for the quiet time...
  const auto t1 = Clock::now();
  queue->WaitForBurstEnd(std::chrono::milliseconds(50), std::chrono::seconds(60));
  const double quiet = seconds_since(t1);
  EXPECT_GE(quiet, 0.045);
  EXPECT_LT(quiet, 30.0);
  // ...and keeps going while they go on.
  std::thread producer([&] {
    for (int i = 0; i < 8; ++i) {
      push("p" + std::to_string(i));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const auto t2 = Clock::now();
  queue->WaitForBurstEnd(std::chrono::milliseconds(100), std::chrono::seconds(60));
  EXPECT_GE(seconds_since(t2), 0.15);
  producer.join();
  EXPECT_EQ(queue->TakeNewRequests().size(), 9u);
}

TEST(ResponseCache, HitsMismatchesAndLeastRecentlyUsedEviction) {
  ResponseCache cache(2);
  const Response a = Allreduce("a", 4), b = Allreduce("b", 4), c = Allreduce("c", 4);
  size_t pos = 99;
  EXPECT_EQ(cache.Find(RequestFor(a, 0), 0, &pos), ResponseCache::Lookup::kMiss);
  EXPECT_EQ(cache.Put(a), "");
  EXPECT_EQ(cache.Put(b), "");
  EXPECT_EQ(cache.Find(RequestFor(a, 0), 0, &pos), ResponseCache::Lookup::kHit);
  cache.Touch(pos);  // b is now the least recently used
  Request changed = RequestFor(a, 0);
  changed.shape = {5};
  EXPECT_EQ(cache.Find(changed, 0, &pos), ResponseCache::Lookup::kMismatch);
  EXPECT_EQ(cache.Put(c), "b");
  EXPECT_EQ(cache.Find(RequestFor(b, 0), 0, &pos), ResponseCache::Lookup::kMiss);
  ASSERT_EQ(cache.Find(RequestFor(c, 0), 0, &pos), ResponseCache::Lookup::kHit);
  cache.Erase(pos);
  EXPECT_EQ(cache.size(), 1u);
  Response err = Allreduce("e", 1);
  err.error = "x";
  EXPECT_FALSE(ResponseCache::Cacheable(err));
  // Allgather: each rank's first dimension is part of the match.
  Response g = Allreduce("g", 0);
  g.type = RequestType::kAllgather;
  g.shapes = {{5, 2}};
  g.rank_dims = {2, 3};
  cache.Put(g);
  Request mine = RequestFor(g, 1);
  mine.shape = {3, 2};
  EXPECT_EQ(cache.Find(mine, 1, &pos), ResponseCache::Lookup::kHit);
  mine.shape = {2, 2};
  EXPECT_EQ(cache.Find(mine, 1, &pos), ResponseCache::Lookup::kMismatch);
  // A response for device memory needs the tensor there; one staged through the host serves both.
  Response d = Allreduce("d", 4);
  d.on_device = true;
  cache.Put(d);
  Request host_now = RequestFor(d, 0);
  EXPECT_EQ(cache.Find(host_now, 0, &pos), ResponseCache::Lookup::kMismatch);
  host_now.on_device = true;
  EXPECT_EQ(cache.Find(host_now, 0, &pos), ResponseCache::Lookup::kHit);
  Response h = Allreduce("h", 4);
  cache.Put(h);
  Request device_now = RequestFor(h, 0);
  device_now.on_device = true;
  EXPECT_EQ(cache.Find(device_now, 0, &pos), ResponseCache::Lookup::kHit);
}

TEST(StallInspector, WarnsOnceThenAsksForShutdown) {
  StallInspector s(1.0, 3.0, 4);
  const auto t0 = StallInspector::Clock::now();
  s.RecordArrival("w", "allreduce", 0, t0);
  s.RecordArrival("w", "allreduce", 2, t0);
  EXPECT_TRUE(s.Check(t0 + std::chrono::milliseconds(500), {}).warnings.empty());
  auto r = s.Check(t0 + std::chrono::milliseconds(1500), {3});
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("tensor 'w' (allreduce) has waited 1.5 s for other ranks: submitted by ranks [0, 2], "
                               "missing ranks [1]"),
            std::string::npos)
      << r.warnings[0];
  EXPECT_TRUE(r.shutdown.empty());
  EXPECT_TRUE(s.Check(t0 + std::chrono::milliseconds(2000), {}).warnings.empty());  // once
  r = s.Check(t0 + std::chrono::seconds(3), {});
  EXPECT_NE(r.shutdown.find("GRADCOMP_STALL_SHUTDOWN_TIME_SECONDS=3"), std::string::npos) << r.shutdown;
  s.Remove("w");
  EXPECT_TRUE(s.Check(t0 + std::chrono::seconds(9), {}).shutdown.empty());
}

TEST(StallInspector, FindsUnnamedCallsOutOfStepAndNothingElse) {
  StallInspector s(0, 0, 4);
  const auto t0 = StallInspector::Clock::now();
  s.RecordArrival("allgather.noname.7.sizes", "allgather", 0, t0);
  s.RecordArrival("allgather.noname.6.sizes", "allgather", 1, t0);
  s.RecordArrival("allgather.noname.6.sizes", "allgather", 3, t0);
  // Not drift: a different suffix or kind, a named tensor, and a tensor some rank has both of.
  s.RecordArrival("allgather.noname.5", "allgather", 2, t0);
  s.RecordArrival("allreduce.noname.1", "allreduce", 0, t0);
  s.RecordArrival("allreduce.noname.2", "allreduce", 0, t0);
  s.RecordArrival("allreduce.noname.2", "allreduce", 1, t0);
  s.RecordArrival("w.noname", "allreduce", 2, t0);
  EXPECT_TRUE(s.FindNameDrift(t0 + std::chrono::milliseconds(500), 1.0).empty());  // too fresh
  const auto drifts = s.FindNameDrift(t0 + std::chrono::seconds(2), 1.0);
  ASSERT_EQ(drifts.size(), 1u);
  EXPECT_EQ(drifts[0].ahead, "allgather.noname.7.sizes");
  EXPECT_EQ(drifts[0].behind, "allgather.noname.6.sizes");
  EXPECT_NE(drifts[0].message.find("ranks [0] submitted 'allgather.noname.7.sizes' while ranks [1, 3] submitted "
                                   "'allgather.noname.6.sizes'. Each rank numbers its unnamed allgather calls"),
            std::string::npos)
      << drifts[0].message;
}

/// The text of the file at `path`, which is then removed.
std::string TakeFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  std::remove(path.c_str());
  return text.str();
}

TEST(Timeline, WritesChromeTraceRowsAndDropsEndsOfPhasesBegunBeforeRecording) {
  const std::string path = ::testing::TempDir() + "gradcomp_timeline_unit.json";
  Timeline t;
  t.End("early", "NEGOTIATE");  // not recording yet: ignored
  t.Start(path, 0);
  t.End("early", "NEGOTIATE");  // its begin was never recorded: dropped
  t.Begin("w\"1", "COMMUNICATE");
  t.Instant("w\"1", "rank 1 ready");
  t.End("w\"1", "COMMUNICATE", "\"bytes\": 12");
  t.Stop();
  const std::string s = TakeFile(path);
  EXPECT_EQ(s.rfind("[\n", 0), 0u) << s;
  EXPECT_EQ(s.substr(s.size() - 3), "\n]\n") << s;
  EXPECT_EQ(s.find("early"), std::string::npos) << s;
  EXPECT_NE(s.find("\"args\": {\"name\": \"w\\\"1\"}"), std::string::npos) << s;  // escaped row name
  EXPECT_NE(s.find("\"name\": \"COMMUNICATE\", \"ph\": \"B\""), std::string::npos) << s;
  EXPECT_NE(s.find("\"ph\": \"E\""), std::string::npos) << s;
  EXPECT_NE(s.find("\"args\": {\"bytes\": 12}"), std::string::npos) << s;
  EXPECT_NE(s.find("\"name\": \"rank 1 ready\", \"ph\": \"i\""), std::string::npos) << s;
  EXPECT_THROW(t.Start("/nonexistent-dir/x.json", 0), InvalidArgument);
}

TEST(Timeline, StopEndsThePhasesStillOpen) {
  // A peer's barrier whose negotiation began on the coordinator just before it stopped
  // recording: the file must still pair every begin with an end.
  const std::string path = ::testing::TempDir() + "gradcomp_timeline_stop.json";
  Timeline t;
  t.Start(path, 0);
  t.Begin("__barrier.3", "NEGOTIATE");
  t.Begin("w", "COMMUNICATE");
  t.End("w", "COMMUNICATE");
  t.Stop();
  t.End("__barrier.3", "NEGOTIATE");  // after the stop: ignored
  const std::string s = TakeFile(path);
  const auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("\"ph\": \"B\""), 2u) << s;
  EXPECT_EQ(count("\"ph\": \"E\""), 2u) << s;
  EXPECT_EQ(count("\"name\": \"NEGOTIATE\", \"ph\": \"E\""), 1u) << s;
  EXPECT_EQ(count("\"cut_by_stop\": true"), 1u) << s;
  EXPECT_EQ(s.substr(s.size() - 3), "\n]\n") << s;
}

TEST(Timeline, EventsOfSeveralThreadsReachTheFileInTimeOrder) {
  // The caller's thread marks "queued" while the background thread records phases on the same
  // row: Chrome's viewer and the users' scripts expect a row's timestamps not to go backwards.
  const std::string path = ::testing::TempDir() + "gradcomp_timeline_threads.json";
  Timeline t;
  t.Start(path, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&t, k] {
      for (int i = 0; i < 3000; ++i) t.Instant("w", "mark " + std::to_string(k));
    });
  }
  for (auto& th : threads) th.join();
  t.Stop();
  const std::string s = TakeFile(path);
  std::vector<long> ts;
  for (size_t p = s.find("\"ts\": "); p != std::string::npos; p = s.find("\"ts\": ", p + 1)) {
    ts.push_back(std::stol(s.substr(p + 6)));
  }
  ASSERT_EQ(ts.size(), 12000u);
  for (size_t i = 1; i < ts.size(); ++i) ASSERT_LE(ts[i - 1], ts[i]) << "event " << i;
}

}  // namespace
}  // namespace gradcomp
