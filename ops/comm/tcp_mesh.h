// The data path of the TCP mesh (ops/comm/tcp_communicator.h): one process's connections to
// every other rank, on which sends and receives are posted, matched per (peer, context, tag)
// in order and moved by poll(); and, when an operation fails, the spreading of the reason to
// every peer (tcp_abort.cc). Internal to ops/comm/tcp_*.
#pragma once

#include <poll.h>

#include <deque>
#include <list>
#include <string>
#include <vector>

#include "ops/comm/tcp_frames.h"

namespace gradcomp {
namespace tcp {

// One connection's state: the operations waiting on it and the frame being read.
struct Peer {
  int fd = -1;
  bool closed = false;  // end of stream: nothing more comes from it, nothing more goes to it
  std::deque<OpPtr> sends;  // in order; the front one is being written
  std::deque<OpPtr> recvs;  // posted and not matched yet, in order
  std::list<Unexpected> unexpected;
  // The frame being read: its header, then its payload into `target` or `buffer`.
  Header header{};
  size_t header_got = 0;
  OpPtr target;
  std::list<Unexpected>::iterator buffer;
  bool buffered = false;
  std::string abort_text;
  bool aborting = false;  // the frame being read is a peer's failure
  size_t payload_got = 0;
};

// The connections of one process to every other rank of the world, shared by the world's
// communicator and its splits. Single-threaded, like every communicator here.
class Mesh {
 public:
  /// `unreachable_seconds`: TcpOptions' (0: unset), for the message when a peer times out.
  Mesh(int rank, std::vector<int> fds, double unreachable_seconds = 0)
      : rank_(rank), unreachable_seconds_(unreachable_seconds), peers_(fds.size()) {
    for (size_t p = 0; p < fds.size(); ++p) peers_[p].fd = fds[p];
  }
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(peers_.size()); }
  uint32_t next_context = 2;  // the world uses 0 (point-to-point) and 1 (collectives)

  /// Posts a send (a receive) of a frame to (from) world rank `peer`; it completes as the
  /// connection moves (Test, Wait, WaitForProgress).
  OpPtr PostSend(int peer, uint32_t context, int tag, const void* data, size_t bytes);
  OpPtr PostRecv(int peer, uint32_t context, int tag, void* data, size_t bytes);

  /// Advances every connection without blocking; true once `op` completed.
  bool Test(const Op& op);

  /// Whether a message on (context, tag) from world rank `peer` has arrived (or is arriving)
  /// that no receive was posted for: a receive from any rank takes the first such peer.
  bool Arrived(int peer, uint32_t context, int tag) const;

  /// Waits up to `seconds` for a connection to become readable (or writable, with sends
  /// pending) or `wake_fd` readable (then read), moving what it can: a polling loop's nap that
  /// ends when bytes arrive or the loop's pipeline finishes a task.
  void WaitForProgress(double seconds, int wake_fd);

  /// Blocks in poll() until every op completed.
  void Wait(const std::vector<OpPtr>& ops);

  /// Sends `text` to every peer that can take it, then closes the sending side of every
  /// connection; every later call throws Error(text). Waits (a bounded time, every peer at once)
  /// until each peer has acknowledged what it was sent: this process may exit next, and closing a
  /// socket with unread bytes in it resets the connection, which can drop what the peer has not
  /// acknowledged yet. finish_frames: the buffers of the sends in flight are still alive (a
  /// failure met inside an operation), so a peer in the middle of one of this rank's frames gets
  /// the rest of it, then the reason; otherwise (AbortTcpWorld: the operation may have unwound)
  /// that peer gets no reason and sees the stream end mid-frame, blaming this rank.
  void Abort(const std::string& text, bool finish_frames);

 private:
  void CheckFailed() const;
  void CheckUsable(int peer, const char* what) const;
  void CheckSize(int peer, const Op& op, size_t arrived);
  std::string Lost(int peer, const std::string& doing) const;
  /// What to say when `peer` acknowledged nothing for unreachable_seconds_ (ETIMEDOUT).
  std::string Unreachable(int peer, const std::string& doing) const;
  // A failure met inside an operation: the buffers of the sends in flight are alive.
  [[noreturn]] void Fail(const std::string& text);

  // One round of I/O: waits up to `timeout` seconds (negative: until something happens) for a
  // socket to be readable or writable, then reads and writes what it can on those.
  void Pump(double timeout, int wake_fd = -1);

  void Write(int peer);

  void Read(int peer);

  // A message to this rank itself: straight into a posted receive, else kept until one comes.
  void SendToSelf(const OpPtr& op);

  static bool Claimed(const Peer& p);

  char* PayloadAt(Peer& p);

  // A header arrived: decide where its payload goes.
  void StartPayload(int peer);

  void FinishFrame(int peer);

  int rank_;
  double unreachable_seconds_;
  std::vector<Peer> peers_;
  std::string failed_;
  std::vector<pollfd> polls_;
  std::vector<int> index_;
};

}  // namespace tcp
}  // namespace gradcomp
