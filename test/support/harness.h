// Multi-rank test harness: ranks as threads over the in-process communicator (gloo's
// `spawn` style). A rank that throws aborts the world so the others fail instead of hanging.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ops/comm/communicator.h"
#include "ops/comm/topology.h"

namespace gradcomp::testing {

/// What the ranks of RunRanks talk through.
enum class RankTransport {
  kInProcess,  ///< the in-process communicator (pointers between threads)
  kTcp,        ///< a TCP world over loopback, connected through the in-process one
};

/// Runs fn(comm) on `world_size` threads, one per rank. Returns each rank's result string
/// (empty = success); an exception on any rank aborts the world and is rethrown here.
std::vector<std::string> RunRanks(int world_size, const std::function<std::string(Communicator&)>& fn,
                                  RankTransport transport = RankTransport::kInProcess);

/// Same, with each rank's Topology built over the in-process world (local_size 0 = one node).
std::vector<std::string> RunTopology(int world_size, int local_size,
                                     const std::function<std::string(Topology&)>& fn);

/// Joins the non-empty results as "rank r: message" lines ("" when all succeeded).
std::string Failures(const std::vector<std::string>& results);

/// CPU seconds the calling thread has used (how much of a core a waiting rank holds).
double ThreadCpuSeconds();

}  // namespace gradcomp::testing
