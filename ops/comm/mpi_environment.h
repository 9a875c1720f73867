// MPI start-up for gradcomp processes, without exposing mpi.h (its teardown: mpi_exit.h).
#pragma once

#include <memory>
#include <vector>

#include "ops/comm/communicator.h"

namespace gradcomp {

/// Initializes MPI with MPI_THREAD_MULTIPLE unless the process already did (mpi4py, a
/// framework). When gradcomp initialized it, MPI_Finalize runs at process exit, so
/// gradcomp can be shut down and initialized again in the same process (after a failure,
/// as ops/comm/mpi_exit.h says).
/// Throws when MPI was initialized by someone else with less than MPI_THREAD_SERIALIZED.
void EnsureMpiInitialized();

/// Initializes MPI if needed and throws unless it provides MPI_THREAD_MULTIPLE (process sets and
/// point-to-point messages call MPI from threads of their own).
void RequireThreadMultiple();

/// A communicator over a duplicate of MPI_COMM_WORLD (calls EnsureMpiInitialized).
std::unique_ptr<Communicator> CreateMpiWorld();

/// Collective over MPI_COMM_WORLD, every rank passing the same sorted `ranks`: a communicator
/// over those ranks (in their order) for the ranks among them, null for the others (a process
/// set's world). Each process set runs a runtime of its own, whose background thread calls MPI
/// alongside the other runtimes': this needs MPI_THREAD_MULTIPLE, and says so otherwise.
std::unique_ptr<Communicator> CreateMpiSubworld(const std::vector<int>& ranks);
/// The same communicator, collective over the ranks in `ranks` only (MPI_Comm_create_group:
/// for groups that only their members create, as torch.distributed's new_group does). The
/// members pass the same `tag`, which no other group being created alongside by any of them uses.
std::unique_ptr<Communicator> CreateMpiGroupWorld(const std::vector<int>& ranks, int tag);

/// Whether the MPI library takes GPU memory (Open MPI's MPIX_Query_cuda_support, when it was
/// built with CUDA; false for any other MPI).
bool MpiIsCudaAware();
/// Collective over `host`: an MPI communicator over its ranks that is handed `device`'s memory,
/// when `host` is an MPI communicator and MPI is CUDA-aware; null otherwise.
std::unique_ptr<Communicator> CudaAwareMpiCommunicator(Communicator& host, Device& device);

}  // namespace gradcomp
