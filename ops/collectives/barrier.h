// Barrier: returns once every rank of the communicator has entered.
#pragma once

#include "ops/comm/communicator.h"

namespace gradcomp {

/// Blocks until all ranks of `comm` have called Barrier.
inline void Barrier(Communicator& comm) { comm.Barrier(); }

}  // namespace gradcomp
