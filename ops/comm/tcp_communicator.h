// A communicator over TCP connections of its own: a full mesh of persistent sockets (gloo's
// pairs), set up once through another communicator. The controller negotiates over it
// (GRADCOMP_CONTROLLER, like HOROVOD_CONTROLLER=gloo); the data between nodes can travel on it
// too (GRADCOMP_CROSS_COMMUNICATOR=tcp), where a polling loop's naps end when bytes arrive
// (WaitForProgress).
//
// Why: Open MPI moves bytes only inside its calls, so a thread waiting for a late peer must
// poll, and gradcomp's polls nap on a timer (PollUntil): a negotiation round whose peer is
// 3 ms late costs ~15 wake-ups, each of which preempts a training thread on cores that
// training saturates (docs/benchmarks.md, "The exchange's CPU"). Here a
// waiting thread sleeps in poll() on its sockets and wakes once, when the peer's bytes arrive.
//
// Messages are framed ([context, tag, bytes] then the payload) and matched per (peer, context,
// tag) in order, as MPI matches them; a message nobody has asked for yet is read into a buffer
// of its own, so two ranks sending to each other never deadlock. Allreduce is recursive
// doubling (with the usual fold for worlds that are not a power of two), latency-bound, for the
// control plane's few words and small tensors; broadcast is a binomial tree; the gathers,
// ReduceScatter and Alltoallv send one message to each peer at once. Bulk allreduces go through
// gradcomp's own algorithms over Isend/Irecv (the SRA), as on MPI.
//
// Failure: a peer that exits closes its sockets, and the next operation that needs it throws
// gradcomp::Error naming both ranks. A rank whose operation fails (or AbortTcpWorld) sends
// the reason to every peer before closing, so every rank waiting on it fails with the root
// cause instead of waiting forever: a peer in the middle of one of its frames first gets the
// rest of the frame (when the failure is met inside an operation, whose buffers are alive), and
// the rank waits (0.25 s plus the frame's rest at 100 Mbit/s, at most 5 s, every peer at once)
// until each peer acknowledged it all, since its exit could otherwise reset the connection and
// drop the reason. Without that, 1 run in 10 of test_faults' cluster kill had a survivor blame
// the other survivor, which was sending it a stripe when it lost the killed rank.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ops/comm/communicator.h"

namespace gradcomp {

struct TcpOptions {
  /// Advertise only the IPv4 addresses of these network interfaces, comma-separated ("" = every
  /// interface that is up, in the order ops/comm/net_interfaces.h gives).
  std::string iface;
  /// How long the whole connection phase may take, waiting for the slowest rank included.
  double connect_timeout_seconds = 30;
  /// How long a peer may acknowledge nothing (neither data nor the keepalive probes sent on an
  /// idle connection) before its connection fails, naming it: a link gone silent (a switch port
  /// dropping everything, a cable pulled) sends no reset, and TCP would otherwise wait for hours.
  /// 0: the kernel's defaults.
  double unreachable_seconds = 0;
};

/// What this rank's connection phase found, for the log.
struct TcpReport {
  /// This rank's interfaces (names) carrying its connections to ranks on other hosts,
  /// comma-separated ("" when every peer runs on this host).
  std::string interfaces;
  /// One line per peer reached only after some of its addresses failed (which, and why).
  std::vector<std::string> detours;
  /// Set when the soft open-file limit was raised to fit the connections (what it was, what it is).
  std::string open_file_limit;
};

/// Collective over `bootstrap` (every rank must call it): each rank listens on an ephemeral
/// port, the addresses go round through `bootstrap`, each rank connects to the ranks below it,
/// the nearest first (trying their addresses in net_interfaces.h's DialOrder: a peer on the
/// same host through 127.0.0.1 first), while a thread of its own accepts the ranks above it; a
/// shared random token checks that each connection reached this job. The result has
/// bootstrap's ranks. A socket per peer: the soft open-file limit is raised to the hard one
/// where they would not fit. Throws gradcomp::Error naming the ranks and addresses that could
/// not be joined, or the limits that are too low; a rank that gives up before dialing makes
/// every rank fail at once, not at the timeout.
std::unique_ptr<Communicator> ConnectTcpWorld(Communicator& bootstrap, const TcpOptions& options,
                                              TcpReport* report = nullptr);

/// Fails `comm` (a communicator from ConnectTcpWorld or its splits) for good: every peer is sent
/// `why`, then the connections close, so each rank blocked on this one (or later calling it)
/// throws gradcomp::Error with "rank R failed: why". No-op on other communicators.
void AbortTcpWorld(Communicator& comm, const std::string& why);

}  // namespace gradcomp
