// A node's shared memory as an MPI-3 window (MPI_Win_allocate_shared): the node communicator of
// an MPI world (topology.cc). Apart from shm_communicator.h so that only this file needs mpi.h.
#pragma once

#include <mpi.h>

#include <memory>

#include "ops/comm/shm_communicator.h"

namespace gradcomp {

/// Collective over `node` (all of whose ranks must share memory; duplicated, not retained): a
/// shared-memory communicator whose messages are MPI's.
std::unique_ptr<Communicator> MakeMpiShmCommunicator(MPI_Comm node,
                                                     size_t staging_bytes = ShmCommunicator::kDefaultStagingBytes);

}  // namespace gradcomp
