// The data plane side of the runtime: executes one negotiated response on this rank by
// calling the collectives of ops/ (fusion buffer in, collective, copy out) and completes
// the handles. Every rank executes the same responses in the same order.
#pragma once

#include <memory>
#include <vector>

#include "core/message.h"
#include "core/settings.h"
#include "core/tensor_queue.h"
#include "core/timeline.h"
#include "ops/comm/topology.h"

namespace gradcomp {

/// This rank's entries for a response's names (nullptr where this rank joined and
/// contributes zeros).
using EntryList = std::vector<std::unique_ptr<TensorEntry>>;

class Executor {
 public:
  Executor(const Topology& topo, const Settings& settings, Timeline& timeline)
      : topo_(topo), settings_(settings), timeline_(timeline) {}

  /// Local preparation that may fail (allocations); runs before the ranks agree to go on.
  void Prepare(const Response& response, EntryList& entries);
  /// Runs the collective and completes the entries' handles.
  void Run(const Response& response, EntryList& entries);

 private:
  void RunAllreduce(const Response& r, EntryList& entries);
  void RunAllgather(const Response& r, EntryList& entries);
  void RunBroadcast(const Response& r, EntryList& entries);
  void RunAlltoall(const Response& r, EntryList& entries);
  void RunReducescatter(const Response& r, EntryList& entries);

  const Topology& topo_;
  const Settings& settings_;
  Timeline& timeline_;
  std::vector<char> fusion_;   // fusion buffer, grown as needed
  std::vector<char> scratch_;  // zeros / receive space of joined ranks
};

/// Number of elements of a shape.
int64_t NumElements(const std::vector<int64_t>& shape);

}  // namespace gradcomp
