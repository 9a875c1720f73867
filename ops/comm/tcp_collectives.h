// The TCP mesh's communicator (ops/comm/tcp_communicator.h): point-to-point over the mesh, and
// the rounds' collectives on it (recursive-doubling allreduce, binomial broadcast, the gathers,
// ReduceScatter and Alltoallv one message a peer at once), with Split giving each subgroup
// contexts of its own. Internal to ops/comm/tcp_*.
#pragma once

#include <memory>
#include <vector>

#include "ops/comm/communicator.h"
#include "ops/comm/tcp_mesh.h"

namespace gradcomp {
namespace tcp {

/// A communicator over `mesh` whose rank r is world rank members[r]; contexts `context` (point
/// to point) and `context + 1` (collectives).
std::unique_ptr<Communicator> MakeCommunicator(std::shared_ptr<Mesh> mesh, uint32_t context,
                                               std::vector<int> members, int rank);
/// The mesh under a communicator of MakeCommunicator (nullptr for any other communicator).
Mesh* MeshOf(Communicator& comm);

/// A receive of `bytes` bytes on `tag` from whichever rank of `comm` (a MakeCommunicator one)
/// sends first (MPI_ANY_SOURCE): once a message has arrived from some rank, that rank's receive
/// is posted, and *source (alive until completion) holds the rank.
std::unique_ptr<PendingTransfer> IrecvFromAny(Communicator& comm, void* data, size_t bytes, int tag, int* source);

}  // namespace tcp
}  // namespace gradcomp
