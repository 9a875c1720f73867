#include "core/controller.h"

#include <algorithm>
#include <sstream>

#include "core/fusion.h"
#include "ops/common/enforce.h"

namespace gradcomp {

namespace {

constexpr uint64_t kNoShutdown = 1;   // flag bits of word 0, stored so that AND means "on every rank"
constexpr uint64_t kNoUncached = 2;
constexpr uint64_t kNoJoin = 4;
constexpr uint64_t kIdle = 8;
constexpr uint64_t kNoCallerWaiting = 16;

size_t Words(size_t bits) { return (bits + 63) / 64; }
void SetBit(std::vector<uint64_t>& w, size_t offset, size_t bit) { w[offset + bit / 64] |= uint64_t{1} << (bit % 64); }
void ClearBit(std::vector<uint64_t>& w, size_t offset, size_t bit) {
  w[offset + bit / 64] &= ~(uint64_t{1} << (bit % 64));
}
bool TestBit(const std::vector<uint64_t>& w, size_t offset, size_t bit) {
  return (w[offset + bit / 64] >> (bit % 64)) & 1;
}

std::string Double(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

Controller::Controller(Communicator& world, const Settings& settings, spdlog::logger& log, Timeline& timeline)
    : world_(world),
      settings_(settings),
      log_(log),
      timeline_(timeline),
      rank_(world.rank()),
      size_(world.size()),
      cache_(static_cast<size_t>(settings.cache_capacity)),
      cache_stall_seconds_(settings.stall_check_time_seconds > 0 ? std::min(5.0, settings.stall_check_time_seconds / 2)
                                                                  : 5.0),
      pending_(cache_.capacity()),
      stall_(settings.stall_check_time_seconds, settings.stall_shutdown_time_seconds, world.size()) {
  if (settings.autotune) {
    // Only rank 0 searches (and writes the log); the others apply its word.
    Settings mine = settings;
    if (rank_ != 0) mine.autotune_log.clear();
    tuner_ = std::make_unique<Autotuner>(mine, log);
  }
}

void Controller::SendPendingToCoordinator(size_t pos) {
  Pending& p = pending_[pos];
  if (!p.active) return;
  to_coordinator_.push_back(std::move(p.request));
  p.active = false;
  --pending_count_;
}

Controller::CycleOutput Controller::RunCycle(CycleInput input) {
  const size_t nw = Words(cache_.capacity());
  std::vector<uint64_t> words = CycleWords(input, Clock::now());
  if (tuner_) words.push_back(rank_ == 0 ? tuner_->Advance(Clock::now()) : ~uint64_t{0});  // rank 0's, after the AND
  // (Over MPI a small allreduce is polled with naps: while this rank waits for a slower one,
  // every cycle of a backward pass, it leaves the core to the training thread.)
  world_.Allreduce(words.data(), words.data(), words.size(), DataType::kInt64, ReduceOp::kBitwiseAnd);
  if (log_.should_log(spdlog::level::trace)) {
    log_.trace("cycle: {} cached pending, {} for the coordinator, {} outstanding, flags {:#x}", pending_count_,
               to_coordinator_.size(), outstanding_.size(), words[0]);
  }

  if (tuner_) tuner_->Apply(words.back());
  CycleOutput out;
  out.busy = !(words[0] & kIdle);
  if (!(words[0] & kNoShutdown)) {
    out.shutdown = true;
    out.stopped_by = RanksShuttingDown(input.shutdown);
    return out;
  }
  const bool join_active = !(words[0] & kNoJoin);
  bool erased_any = false;
  for (size_t pos = 0; pos < cache_.capacity(); ++pos) {
    if (TestBit(words, 1 + nw, pos)) continue;
    erased_any = true;
    SendPendingToCoordinator(pos);
    cache_.Erase(pos);
  }
  out.responses = TakeReadyFromCache(words);
  if (join_active) {
    // Joined ranks set no ready bits: cached tensors are matched by the coordinator instead.
    for (size_t pos = 0; pos < cache_.capacity() && pending_count_ > 0; ++pos) SendPendingToCoordinator(pos);
  }
  out.from_cache = out.responses.size();
  if (!(words[0] & kNoUncached) || erased_any || join_active) {
    std::vector<Request> mine;
    mine.swap(to_coordinator_);
    for (const Request& r : mine) outstanding_.insert(r.name);
    std::vector<Response> coordinated = Coordinate(mine, &out.fatal);
    out.responses.insert(out.responses.end(), coordinated.begin(), coordinated.end());
    if (!out.fatal.empty()) out.shutdown = true;
  }
  return out;
}

std::vector<int> Controller::RanksShuttingDown(bool mine) {
  const size_t n = static_cast<size_t>(world_.size());
  std::vector<uint64_t> bits(Words(n), ~uint64_t{0});  // a cleared bit: that rank asked to stop
  if (mine) ClearBit(bits, 0, static_cast<size_t>(rank_));
  world_.Allreduce(bits.data(), bits.data(), bits.size(), DataType::kInt64, ReduceOp::kBitwiseAnd);
  std::vector<int> ranks;
  for (size_t r = 0; r < n; ++r) {
    if (!TestBit(bits, 0, r)) ranks.push_back(static_cast<int>(r));
  }
  return ranks;
}

std::vector<uint64_t> Controller::CycleWords(CycleInput& input, Clock::time_point now) {
  const size_t cap = cache_.capacity();
  const size_t nw = Words(cap);
  // Words: [flags][ready bits][keep bits].
  std::vector<uint64_t> words(1 + 2 * nw, 0);
  std::fill(words.begin() + 1 + static_cast<long>(nw), words.end(), ~uint64_t{0});
  for (Request& r : input.fresh) {
    if (r.type == RequestType::kJoin) joined_ = true;
    size_t pos = 0;
    const bool cacheable = r.type != RequestType::kJoin && r.type != RequestType::kBarrier;
    const auto found = cacheable ? cache_.Find(r, rank_, &pos) : ResponseCache::Lookup::kMiss;
    if (found == ResponseCache::Lookup::kHit) {
      Pending& p = pending_[pos];
      if (!p.active) ++pending_count_;  // (active: impossible, names are unique while pending)
      p.active = true;
      p.request = std::move(r);
      p.since = now;
      continue;
    }
    if (found == ResponseCache::Lookup::kMismatch) ClearBit(words, 1 + nw, pos);
    to_coordinator_.push_back(std::move(r));
  }
  for (size_t pos = 0, seen = 0; seen < pending_count_ && pos < cap; ++pos) {
    const Pending& p = pending_[pos];
    if (!p.active) continue;
    ++seen;
    SetBit(words, 1, pos);
    if (std::chrono::duration<double>(now - p.since).count() > cache_stall_seconds_) ClearBit(words, 1 + nw, pos);
  }
  const bool busy = pending_count_ > 0 || !to_coordinator_.empty() || !outstanding_.empty() || joined_;
  // The coordinator also asks for a slow path now and then while tensors wait in its table,
  // so the stall inspector runs even when no new requests arrive.
  bool want_slow = !to_coordinator_.empty();
  if (rank_ == 0 && !table_.empty() && std::chrono::duration<double>(now - last_stall_check_).count() >= 0.1) {
    want_slow = true;
  }
  words[0] = (input.shutdown ? 0 : kNoShutdown) | (want_slow ? 0 : kNoUncached) | (joined_ ? 0 : kNoJoin) |
             (busy ? 0 : kIdle) | (input.caller_waiting ? 0 : kNoCallerWaiting);
  return words;
}

std::vector<Response> Controller::TakeReadyFromCache(const std::vector<uint64_t>& words) {
  const size_t cap = cache_.capacity(), nw = Words(cap);
  // Positions ready everywhere and kept everywhere, a word at a time (position order).
  std::vector<size_t> ready;
  bool prioritized = false;
  for (size_t w = 0; w < nw; ++w) {
    for (uint64_t bits = words[1 + w] & words[1 + nw + w]; bits != 0; bits &= bits - 1) {
      const size_t pos = w * 64 + static_cast<size_t>(__builtin_ctzll(bits));
      if (pos >= cap) break;
      ready.push_back(pos);
      prioritized = prioritized || cache_.Get(pos).Priority() != 0;
    }
  }
  // Too little for a collective of its own while no caller waits: wait for more (every rank
  // decides alike: same ready set, same cache, same flags).
  if (!ready.empty() && (words[0] & kNoCallerWaiting) && batch_cycles_ < kMaxBatchCycles &&
      settings_.batch_min_kb > 0) {
    int64_t missing = static_cast<int64_t>(settings_.batch_min_kb * 1024);
    for (size_t pos : ready) missing -= cache_.Get(pos).PayloadBytes();
    if (missing > 0) {
      for (size_t pos : ready) pending_[pos].since = Clock::now();  // ready everywhere: not a stall
      ++batch_cycles_;
      ++batch_waits_;
      batch_missing_bytes_ = missing;
      return {};
    }
  }
  batch_cycles_ = 0;
  // With priorities, the most urgent first, and only up to the scheduling credit this cycle:
  // the rest stay pending (their bits are set again next cycle), so that a more urgent tensor
  // that becomes ready while these run goes before them. The cache is identical on every
  // rank, so is this choice.
  int64_t credit = 0;
  if (prioritized) {
    std::stable_sort(ready.begin(), ready.end(),
                     [&](size_t a, size_t b) { return cache_.Get(a).Priority() < cache_.Get(b).Priority(); });
    credit = static_cast<int64_t>(settings_.scheduling_credit_mb * 1024 * 1024);
  }
  FusionPlanner from_cache(static_cast<int64_t>(fusion_threshold_mb() * 1024 * 1024));
  int64_t taken = 0;
  for (size_t pos : ready) {
    if (credit > 0 && taken >= credit) {
      ++deferred_;
      pending_[pos].since = Clock::now();  // ready everywhere: not a stall
      continue;
    }
    Pending& p = pending_[pos];
    if (p.active) {
      p.active = false;
      // Released by moving it out (assigning a fresh Request here trips GCC 12's
      // -Wmaybe-uninitialized at -O3, a false positive).
      Request done = std::move(p.request);
      --pending_count_;
    }
    const Response& r = cache_.Get(pos);
    taken += r.PayloadBytes();
    from_cache.Add(r);
    ++cache_hits_;
  }
  return from_cache.Take();
}

void Controller::Executed(const Response& single, bool from_cache) {
  if (tuner_ && rank_ == 0 && single.error.empty()) tuner_->Executed(single.PayloadBytes());
  outstanding_.erase(single.names[0]);
  if (single.type == RequestType::kJoin) joined_ = false;
  if (from_cache) {
    size_t pos = 0;
    if (cache_.PositionOf(single.names[0], &pos)) cache_.Touch(pos);
    return;
  }
  if (!ResponseCache::Cacheable(single)) return;
  const std::string evicted = cache_.Put(single);
  if (evicted.empty()) return;
  // A pending hit on the evicted position (now this tensor's) would point at the wrong response.
  size_t pos = 0;
  if (cache_.PositionOf(single.names[0], &pos) && pending_[pos].active && pending_[pos].request.name == evicted) {
    SendPendingToCoordinator(pos);
  }
}

std::vector<Response> Controller::Coordinate(const std::vector<Request>& mine, std::string* fatal) {
  const std::string payload = SerializeRequests(mine);
  const uint64_t my_len = payload.size();
  std::vector<uint64_t> lens(static_cast<size_t>(size_), 0);
  world_.Gatherv(&my_len, lens.data(), std::vector<size_t>(static_cast<size_t>(size_), sizeof(uint64_t)), 0);
  std::vector<size_t> bytes(static_cast<size_t>(size_), 0);
  bytes[static_cast<size_t>(rank_)] = payload.size();
  if (rank_ == 0) bytes.assign(lens.begin(), lens.end());
  std::string all(rank_ == 0 ? Offsets(bytes).back() + bytes.back() : 0, '\0');
  world_.Gatherv(payload.data(), all.data(), bytes, 0);

  std::string reply;
  uint64_t header[2] = {0, 0};  // response bytes, fatal message bytes
  if (rank_ == 0) {
    const Clock::time_point now = Clock::now();
    const std::vector<size_t> offsets = Offsets(bytes);
    for (int r = 0; r < size_; ++r) {
      const size_t i = static_cast<size_t>(r);
      for (const Request& req : ParseRequests(all.substr(offsets[i], bytes[i]))) CoordinatorAdd(req, now);
    }
    std::vector<Response> ready = CoordinatorReady();
    for (Response& failed : FailNameDrift(now)) ready.push_back(std::move(failed));
    const std::set<int> joined(join_order_.begin(), join_order_.end());
    StallInspector::Report report = stall_.Check(now, joined);
    last_stall_check_ = now;
    for (const std::string& w : report.warnings) log_.warn("{}", w);
    const int64_t threshold = static_cast<int64_t>(fusion_threshold_mb() * 1024 * 1024);
    reply = SerializeResponses(FuseResponses(std::move(ready), threshold));
    header[0] = reply.size();
    header[1] = report.shutdown.size();
    reply += report.shutdown;
  }
  world_.Broadcast(header, sizeof header, 0);
  reply.resize(header[0] + header[1]);
  world_.Broadcast(reply.data(), reply.size(), 0);
  *fatal = reply.substr(header[0]);
  std::vector<Response> responses = ParseResponses(reply.substr(0, header[0]));
  for (const Response& r : responses) {
    if (r.type != RequestType::kJoin) coordinator_responses_ += r.names.size();
  }
  return responses;
}

std::vector<Response> Controller::FailNameDrift(Clock::time_point now) {
  // Long enough that two threads of one process submitting unnamed calls out of order have
  // long caught up; short enough that a user sees the error instead of a hang.
  constexpr double kNameDriftSeconds = 1.0;
  std::vector<Response> failed;
  for (const StallInspector::Drift& d : stall_.FindNameDrift(now, kNameDriftSeconds)) {
    log_.error("{}", d.message);
    for (const std::string& name : {d.ahead, d.behind}) {
      const auto it = table_.find(name);
      if (it == table_.end()) continue;
      const Request& ref = it->second.by_rank.begin()->second;
      Response resp;
      resp.type = ref.type;
      resp.names = {name};
      resp.dtype = ref.dtype;
      resp.shapes = {ref.shape};
      resp.error = d.message;
      failed.push_back(std::move(resp));
      timeline_.End(name, "NEGOTIATE");
      stall_.Remove(name);
      table_.erase(it);
      arrival_order_.erase(std::remove(arrival_order_.begin(), arrival_order_.end(), name), arrival_order_.end());
    }
  }
  return failed;
}

void Controller::CoordinatorAdd(const Request& r, Clock::time_point now) {
  if (r.type == RequestType::kJoin) {
    if (std::find(join_order_.begin(), join_order_.end(), r.rank) == join_order_.end()) join_order_.push_back(r.rank);
    timeline_.Instant("join", "rank " + std::to_string(r.rank) + " joined");
    return;
  }
  auto [it, fresh] = table_.try_emplace(r.name);
  if (fresh) {
    arrival_order_.push_back(r.name);
    timeline_.Begin(r.name, "NEGOTIATE");
  }
  it->second.by_rank[r.rank] = r;
  stall_.RecordArrival(r.name, RequestTypeName(r.type), r.rank, now);
  timeline_.Instant(r.name, "rank " + std::to_string(r.rank) + " ready");
}

std::vector<Response> Controller::CoordinatorReady() {
  const std::set<int> joined(join_order_.begin(), join_order_.end());
  std::vector<Response> ready;
  std::vector<std::string> still_waiting;
  bool prioritized = false;
  for (const std::string& name : arrival_order_) {
    const TableEntry& entry = table_.at(name);
    bool complete = true;
    for (int r = 0; r < size_ && complete; ++r) complete = entry.by_rank.count(r) || joined.count(r);
    if (!complete) {
      still_waiting.push_back(name);
      continue;
    }
    ready.push_back(BuildResponse(name, entry));
    prioritized = prioritized || ready.back().Priority() != 0;
    timeline_.End(name, "NEGOTIATE");
    stall_.Remove(name);
    table_.erase(name);
  }
  arrival_order_.swap(still_waiting);
  if (prioritized) {
    // The most urgent allreduces first (the others, errors included, after them in arrival order).
    const auto key = [](const Response& r) {
      return r.type == RequestType::kAllreduce && r.error.empty() ? r.Priority() : INT64_MAX;
    };
    std::stable_sort(ready.begin(), ready.end(), [&](const Response& a, const Response& b) { return key(a) < key(b); });
  }
  if (!join_order_.empty() && static_cast<int>(join_order_.size()) == size_) {
    Response join;
    join.type = RequestType::kJoin;
    join.names = {"__join__"};
    join.last_joined = join_order_.back();
    ready.push_back(join);
    join_order_.clear();
  }
  return ready;
}

namespace {

// Whether every rank's request for the tensor agrees with the first one on each field that
// must be equal; if not, `error` lists each rank's value of the first field that differs.
bool FieldsAgree(const std::map<int, Request>& by_rank, const std::string& what, const std::vector<int>& names,
                 std::string* error) {
  const Request& ref = by_rank.begin()->second;
  auto check = [&](const char* field, auto value_of) -> bool {
    const std::string want = value_of(ref);
    bool same = true;
    for (const auto& [rank, req] : by_rank) same = same && value_of(req) == want;
    if (same) return true;
    std::ostringstream os;
    os << "mismatched " << field << " for " << what << ":";
    bool first = true;
    for (const auto& [rank, req] : by_rank) {
      os << (first ? " " : ", ") << "rank " << RankName(names, rank) << " " << value_of(req);
      first = false;
    }
    *error = os.str();
    return false;
  };
  const bool ok =
      check("operation", [](const Request& r) { return std::string(RequestTypeName(r.type)); }) &&
      check("dtype", [](const Request& r) { return std::string(DataTypeName(r.dtype)); }) &&
      check("rank of shape", [](const Request& r) { return std::to_string(r.shape.size()); });
  if (!ok) return false;
  const bool first_dim_free = ref.type == RequestType::kAllgather || ref.type == RequestType::kAlltoall;
  if (first_dim_free) {
    if (!check("shape after the first dimension", [](const Request& r) {
          return ShapeString(std::vector<int64_t>(r.shape.begin() + (r.shape.empty() ? 0 : 1), r.shape.end()));
        })) {
      return false;
    }
  } else if (!check("shape", [](const Request& r) { return ShapeString(r.shape); })) {
    return false;
  }
  if (ref.type == RequestType::kAllreduce || ref.type == RequestType::kReducescatter) {
    if (!check("op", [](const Request& r) { return std::string(ReduceOpName(r.op)); }) ||
        !check("prescale factor", [](const Request& r) { return Double(r.prescale); }) ||
        !check("postscale factor", [](const Request& r) { return Double(r.postscale); }) ||
        !check("compression", [](const Request& r) { return r.compression.Describe(); }) ||
        !check("priority", [](const Request& r) { return std::to_string(r.priority); })) {
      return false;
    }
  }
  if (ref.type == RequestType::kAllgather &&
      !check("compression", [](const Request& r) { return r.compression.Describe(); })) {
    return false;
  }
  if (ref.type == RequestType::kBroadcast) {
    return check("root rank", [&names](const Request& r) { return std::to_string(RankName(names, r.root)); });
  }
  return true;
}

}  // namespace

Response Controller::BuildResponse(const std::string& name, const TableEntry& entry) const {
  const Request& ref = entry.by_rank.begin()->second;
  Response resp;
  resp.type = ref.type;
  resp.names = {name};
  resp.dtype = ref.dtype;
  resp.op = ref.op;
  resp.root = ref.root;
  resp.prescale = ref.prescale;
  resp.postscale = ref.postscale;
  resp.compression = ref.compression;
  resp.shapes = {ref.shape};
  resp.priorities = {ref.priority};
  // Device communicators only when every rank has the tensor in device memory (and none joined:
  // a joined rank has no device buffer to contribute from).
  resp.on_device = join_order_.empty() && static_cast<int>(entry.by_rank.size()) == size_;
  for (const auto& [rank, req] : entry.by_rank) resp.on_device = resp.on_device && req.on_device;
  const std::string what = std::string(RequestTypeName(ref.type)) + " of tensor '" + name + "'";
  if (!FieldsAgree(entry.by_rank, what, names_, &resp.error)) return resp;
  if (!join_order_.empty() && ref.type != RequestType::kAllreduce && ref.type != RequestType::kBarrier) {
    // As Horovod: only allreduces go on while ranks have joined (they contribute zeros).
    std::ostringstream ranks;
    for (size_t i = 0; i < join_order_.size(); ++i) ranks << (i ? ", " : "") << join_order_[i];
    resp.error = what + ": not supported while ranks have joined (rank " + ranks.str() +
                 "); only allreduce continues until every rank has called join";
    return resp;
  }
  if (ref.type == RequestType::kAllgather) {
    int64_t total = 0;
    resp.rank_dims.assign(static_cast<size_t>(size_), 0);
    for (const auto& [rank, req] : entry.by_rank) {
      resp.rank_dims[static_cast<size_t>(rank)] = req.shape[0];
      total += req.shape[0];
    }
    resp.shapes[0][0] = total;
  }
  if (ref.type == RequestType::kAlltoall) {
    for (const auto& [rank, req] : entry.by_rank) {
      resp.rank_dims.insert(resp.rank_dims.end(), req.splits.begin(), req.splits.end());
    }
  }
  return resp;
}

void Controller::AgreeOnFailures(std::vector<std::string>* failures) {
  int32_t ok = 1;
  for (const std::string& f : *failures) ok = ok && f.empty();
  world_.Allreduce(&ok, &ok, 1, DataType::kInt32, ReduceOp::kMin);
  if (ok) return;
  // Each rank's failures as "index<TAB>message" lines; the first rank's message wins.
  std::string mine;
  for (size_t i = 0; i < failures->size(); ++i) {
    if (!(*failures)[i].empty()) mine += std::to_string(i) + "\t" + (*failures)[i] + "\n";
  }
  const std::vector<std::string> all = AllgatherStrings(world_, mine);
  std::vector<std::string> merged(failures->size());
  for (size_t r = 0; r < all.size(); ++r) {
    const std::string& part = all[r];
    for (size_t p = 0, q; (q = part.find('\n', p)) != std::string::npos; p = q + 1) {
      const std::string line = part.substr(p, q - p);
      const size_t tab = line.find('\t');
      const size_t idx = std::stoul(line.substr(0, tab));
      GC_ENFORCE(idx < merged.size(), "rank ", r, " reported a failure for response ", idx, " of ", merged.size());
      if (merged[idx].empty()) {
        merged[idx] = "rank " + std::to_string(RankName(names_, static_cast<int>(r))) + ": " + line.substr(tab + 1);
      }
    }
  }
  failures->swap(merged);
}

}  // namespace gradcomp
