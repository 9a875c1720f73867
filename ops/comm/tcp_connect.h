// Connecting the TCP mesh (ops/comm/tcp_communicator.h): each rank listens on an ephemeral
// port, the endpoints go round through a bootstrap communicator, each rank dials the ranks below
// it (the nearest first, a peer's addresses in happy-eyeballs fashion) while a thread of its own
// accepts the ranks above, and a greeting with the job's token checks every connection.
// Internal to ops/comm/tcp_*.
#pragma once

#include <string>
#include <vector>

#include "ops/comm/communicator.h"
#include "ops/comm/tcp_communicator.h"

namespace gradcomp {
namespace tcp {

/// This rank's part of the connection phase: a socket per peer into *fds (-1 for itself);
/// returns "" or what went wrong. `elsewhere` tells a rank that found nothing wrong itself that
/// some other rank gave up before connecting (its own error says why), so that nobody waits for
/// its calls.
std::string ConnectMesh(Communicator& bootstrap, const TcpOptions& options, std::vector<int>* fds, TcpReport* report,
                        bool* elsewhere);

/// "rank 3", "ranks 0-2, 5, 7-9": a large job's ranks named in one line.
std::string RankSet(const std::vector<int>& ranks);

}  // namespace tcp
}  // namespace gradcomp
