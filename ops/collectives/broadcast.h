// Broadcast of one buffer from a root rank.
#pragma once

#include <string>

#include "ops/comm/communicator.h"

namespace gradcomp {

/// Arguments of one broadcast: root's `buffer` is copied into every rank's `buffer`.
struct BroadcastOptions {
  void* buffer = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  int root = 0;
  std::string name;
};

/// Broadcasts root's buffer to every rank.
void Broadcast(Communicator& comm, const BroadcastOptions& opts);

}  // namespace gradcomp
