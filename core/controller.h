// The controller: how ranks agree, cycle after cycle, on which tensors to reduce and in which
// order, so every rank executes the same responses in the same order.
//
// Protocol of one cycle (every rank calls RunCycle once per cycle; all communication is on
// the world communicator, from the background thread only):
//
//  1. Classify the requests enqueued since the last cycle. A request whose name is in the
//     response cache with identical parameters is a *hit*: the rank sets the bit of its cache
//     position in its ready vector and keeps the request pending. Same name with other
//     parameters (a shape change, say) is a *mismatch*: the rank clears the position's bit in
//     its keep vector and sends the request to the coordinator. Joins, barriers and unknown
//     names go to the coordinator. A cached request pending longer than the cache stall time
//     also clears its keep bit, so a tensor missing on some rank reaches the stall inspector.
//  2. One bitwise-AND allreduce of [flags | ready bits | keep bits] (uint64 words). Flags are
//     stored inverted so AND acts as OR where needed: "nobody shuts down", "nobody has
//     requests for the coordinator", "nobody has joined", "nobody is busy", "nobody has a
//     caller blocked on a handle".
//  3. From the result, identically on every rank: positions whose keep bit is 0 are erased
//     from every cache (a rank holding a pending request there sends it to the coordinator
//     now); positions ready on every rank become responses, in position order. While some
//     rank has joined, cached requests go to the coordinator (joined ranks set no bits).
//     Scheduling: when ready positions carry priorities (Request::priority), they become
//     responses most urgent first and only up to GRADCOMP_SCHEDULING_CREDIT_MB of payload a
//     cycle; the rest stay pending and are ready again next cycle, so a more urgent tensor
//     that arrives meanwhile overtakes them (the coordinator's responses are ordered alike).
//     Batching: ready positions totalling less than GRADCOMP_BATCH_MIN_KB stay pending too,
//     unless some rank has a caller blocked on a pending handle (a flag: the producer has
//     submitted what it will for now, e.g. the optimizer's step after a backward pass) or
//     they have waited kMaxBatchCycles cycles; a backward pass of many small tensors, ready a
//     few at a time, then runs as a few collectives instead of one or two a tensor.
//  4. Slow path, only when some rank has requests for the coordinator (known from the flags
//     and the erased positions, so every rank decides alike): each rank sends its serialized
//     request list to rank 0 (gather). Rank 0 counts, per name, which ranks asked (joined
//     ranks count as present), validates that type, dtype, shape, op, root, scale factors and
//     compression agree once all ranks are in (a disagreement becomes an error response that
//     names the tensor, the field and every rank's value), checks for stalled tensors, fuses
//     the ready responses up to the fusion threshold and broadcasts the ordered list.
//  5. The cycle's responses are the cached ones (fused locally with the same deterministic
//     planner) followed by the coordinator's. The runtime executes them in that order on
//     every rank and reports each executed tensor back (Executed), so all caches learn the
//     same responses in the same order and stay identical.
//
//  6. Before running the cycle's collectives the ranks agree that every one of them could
//     prepare them (AgreeOnFailures); a local failure fails that response on every rank.
//
// A shutdown on any rank (or a stall shutdown decided by rank 0) ends the loop on every rank.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "core/autotune.h"
#include "core/message.h"
#include "core/response_cache.h"
#include "core/settings.h"
#include "core/stall_inspector.h"
#include "core/timeline.h"
#include "ops/comm/communicator.h"

namespace gradcomp {

class Controller {
 public:
  using Clock = std::chrono::steady_clock;

  Controller(Communicator& world, const Settings& settings, spdlog::logger& log, Timeline& timeline);

  /// What this rank brings to a cycle.
  struct CycleInput {
    std::vector<Request> fresh;  ///< requests enqueued since the last cycle
    bool shutdown = false;       ///< this rank wants to stop
    bool caller_waiting = false;  ///< a caller blocks on a pending handle: run what is ready
  };
  /// What every rank does next.
  struct CycleOutput {
    std::vector<Response> responses;  ///< to execute, in this order
    bool shutdown = false;            ///< stop the background loop
    std::string fatal;                ///< why, when it is an error (stall shutdown)
    bool busy = false;                ///< some rank has work pending: keep cycling briskly
    size_t from_cache = 0;            ///< the first `from_cache` responses came from the cache
    std::vector<int> stopped_by;      ///< on shutdown: the ranks that asked for it
  };
  /// Collective over the world: one negotiation cycle (see the protocol above).
  CycleOutput RunCycle(CycleInput input);

  /// Collective over the world, after every rank prepared this cycle's responses and before
  /// any runs them: `failures[i]` is this rank's error for response i ("" if it can run).
  /// Afterwards every rank holds, for each response, the first failing rank's message
  /// ("rank R: ..."), so all fail it alike instead of waiting for the failed rank forever.
  /// Costs one allreduce of a flag when nobody failed.
  void AgreeOnFailures(std::vector<std::string>* failures);

  /// Messages (mismatches, stalls, failures) name rank r as names[r]: a process set's ranks
  /// by their rank in MPI's world. Empty: r.
  void SetRankNames(std::vector<int> names) {
    stall_.SetRankNames(names);
    names_ = std::move(names);
  }

  /// Reports a response executed on this rank (the unfused single-tensor responses), so the
  /// cache learns it; `from_cache` marks responses that came from cache positions.
  void Executed(const Response& single, bool from_cache);

  /// Number of tensors answered from the cache / by the coordinator so far (for tests; the
  /// counts are updated before the tensors execute).
  uint64_t cache_hits() const { return cache_hits_; }
  /// Ready cached tensors left for a later cycle by the scheduling credit (so far).
  uint64_t deferred() const { return deferred_; }
  /// Cycles whose ready cached tensors all waited for a larger batch (so far).
  uint64_t batch_waits() const { return batch_waits_; }
  /// The last cycle left ready tensors waiting for a larger batch: a caller that now blocks
  /// on a handle should start a cycle at once (its flag releases them).
  bool batching() const { return batch_cycles_ > 0; }
  /// Bytes the ready tensors waiting for a larger batch lack (at least 1), 0 when none wait.
  int64_t batch_missing_bytes() const { return batching() ? batch_missing_bytes_ : 0; }
  /// Most cycles ready tensors wait for a larger batch.
  static constexpr int kMaxBatchCycles = 16;
  uint64_t coordinator_responses() const { return coordinator_responses_; }
  const ResponseCache& cache() const { return cache_; }
  /// The fusion threshold and cycle time in force (GRADCOMP_AUTOTUNE changes them; thread-safe).
  double fusion_threshold_mb() const { return tuner_ ? tuner_->fusion_threshold_mb() : settings_.fusion_threshold_mb; }
  double cycle_time_ms() const { return tuner_ ? tuner_->cycle_time_ms() : settings_.cycle_time_ms; }
  /// The autotuner, when GRADCOMP_AUTOTUNE is on (its search runs on rank 0).
  const Autotuner* autotuner() const { return tuner_.get(); }
  /// Tensors this rank knows of that are not answered yet: pending cache hits, requests
  /// waiting for the coordinator and (rank 0) the coordinator's table.
  size_t open_tensors() const { return pending_count_ + to_coordinator_.size() + outstanding_.size() + table_.size(); }

 private:
  // A cache hit waiting for every rank, at its cache position.
  struct Pending {
    bool active = false;
    Request request;
    Clock::time_point since;
  };
  // The shutdown round's second allreduce (every rank takes part: every rank saw the flag):
  // the ranks that asked to stop, so the others' errors can name them.
  std::vector<int> RanksShuttingDown(bool mine);
  // Moves the pending hit at `pos` to the coordinator's next slow path.
  void SendPendingToCoordinator(size_t pos);
  // This rank's words of a cycle's agreement (flags, ready bits, keep bits), from the fresh
  // requests and the cached ones pending.
  std::vector<uint64_t> CycleWords(CycleInput& input, Clock::time_point now);
  // The cached responses every rank is ready for and keeps, fused.
  std::vector<Response> TakeReadyFromCache(const std::vector<uint64_t>& words);
  // Rank 0's view of requests not yet answered.
  struct TableEntry {
    std::map<int, Request> by_rank;
  };

  std::vector<Response> Coordinate(const std::vector<Request>& mine, std::string* fatal);
  void CoordinatorAdd(const Request& r, Clock::time_point now);
  std::vector<Response> CoordinatorReady();
  // Fails the pairs of unnamed tensors whose ranks' counters drifted apart (StallInspector::
  // FindNameDrift), on every rank, instead of letting them wait forever.
  std::vector<Response> FailNameDrift(Clock::time_point now);
  Response BuildResponse(const std::string& name, const TableEntry& entry) const;

  Communicator& world_;
  const Settings& settings_;
  spdlog::logger& log_;
  Timeline& timeline_;
  const int rank_, size_;
  std::vector<int> names_;  // SetRankNames
  ResponseCache cache_;
  double cache_stall_seconds_;
  std::vector<Pending> pending_;                              // by cache position
  size_t pending_count_ = 0;
  std::vector<Request> to_coordinator_;                      // sent in the next slow path
  std::set<std::string> outstanding_;                        // sent, not answered yet
  bool joined_ = false;                                      // this rank's join is pending
  // Rank 0 only.
  std::map<std::string, TableEntry> table_;
  std::vector<std::string> arrival_order_;
  std::vector<int> join_order_;
  StallInspector stall_;
  Clock::time_point last_stall_check_;
  std::unique_ptr<Autotuner> tuner_;  // GRADCOMP_AUTOTUNE: one more agreement word, rank 0's
  // Written by the background thread, read by stats() on any thread.
  std::atomic<uint64_t> cache_hits_{0};
  std::atomic<uint64_t> deferred_{0};
  std::atomic<uint64_t> batch_waits_{0};
  int batch_cycles_ = 0;  // consecutive cycles the ready tensors waited for a larger batch
  int64_t batch_missing_bytes_ = 0;
  std::atomic<uint64_t> coordinator_responses_{0};
};

}  // namespace gradcomp
