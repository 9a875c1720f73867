// A node's shared memory as a POSIX shared-memory object (shm_open), for a world without MPI
// (the TCP world of an env:// launch, ops/comm/store_world.h): the node's rank 0 creates an
// object of a random name under /dev/shm and reserves its pages, the others map it by that name,
// and it is unlinked once every rank has mapped it (a crash afterwards leaves nothing behind).
#pragma once

#include <memory>

#include "ops/comm/shm_communicator.h"

namespace gradcomp {

/// Collective over `node` (whose ranks must share a host): a shared-memory communicator whose
/// messages are `node`'s. Throws gradcomp::Error on every rank of the node where the memory
/// cannot be had, naming its size, /dev/shm and GRADCOMP_SHM_BUFFER_MB.
std::unique_ptr<Communicator> MakePosixShmCommunicator(std::unique_ptr<Communicator> node,
                                                       size_t staging_bytes = ShmCommunicator::kDefaultStagingBytes);

}  // namespace gradcomp
