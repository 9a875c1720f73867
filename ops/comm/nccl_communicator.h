// Communicator over NCCL for buffers in CUDA device memory (a backend file: only it and
// nccl_communicator.cc include nccl.h). Built when CMake finds CUDA and NCCL
// (GRADCOMP_HAVE_NCCL_COMMUNICATOR in config.h). Every pointer handed to it must be device
// memory of the device it was created on. The Communicator contract is blocking: each call
// enqueues its NCCL operations (grouped where several are needed) on the communicator's own
// stream and waits for that stream, so callers may reuse buffers on return. NCCL orders
// messages per peer, so tags are not used.
#pragma once

#include <memory>

#include "ops/comm/communicator.h"

namespace gradcomp {

/// Collective over `bootstrap`'s ranks (typically an MPI communicator; host memory): rank 0
/// creates the NCCL unique id and broadcasts it over `bootstrap`, then every rank joins the
/// NCCL communicator on CUDA device `device`. NCCL needs one GPU per rank of a communicator.
std::unique_ptr<Communicator> CreateNcclCommunicator(Communicator& bootstrap, int device);

/// NCCL_VERSION_CODE of the headers this was built with (22809 for 2.28.9), as Horovod's
/// nccl_built() reports it.
int NcclVersionCode();

}  // namespace gradcomp
