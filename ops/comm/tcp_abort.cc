// Failure spreading on the TCP mesh: a rank whose operation fails (or that AbortTcpWorld stops)
// sends the reason to every peer before closing, so every rank waiting on it fails with the root
// cause instead of waiting forever (ops/comm/tcp_communicator.h says why and how long it waits).
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <sstream>
#include <string>

#include "ops/comm/tcp_mesh.h"
#include "ops/common/enforce.h"

namespace gradcomp {
namespace tcp {

void Mesh::Abort(const std::string& text, bool finish_frames) {
  if (!failed_.empty()) return;
  failed_ = text;
  const std::string body = text.substr(0, kMaxAbortText);
  const Header h{kAbortContext, 0, body.size()};
  struct Out {
    int fd;
    std::vector<iovec> iov;  // what is left to write
    bool done = false;
  };
  std::vector<Out> outs;
  size_t most = 0;  // the largest rest of a frame
  for (Peer& p : peers_) {
    if (p.fd < 0 || p.closed) continue;
    Out out{p.fd, {}};
    const bool mid_frame = !p.sends.empty() && p.sends.front()->done > 0;
    if (mid_frame && finish_frames) {
      Op& op = *p.sends.front();
      iovec rest[2];
      out.iov.assign(rest, rest + FrameRest(op, rest));
      most = std::max<size_t>(most, sizeof(Header) + op.bytes - op.done);
    }
    if (!mid_frame || finish_frames) {
      out.iov.push_back({const_cast<Header*>(&h), sizeof h});
      out.iov.push_back({const_cast<char*>(body.data()), body.size()});
    }
    outs.push_back(std::move(out));
  }
  // A quarter second, plus the rest of the largest frame at 100 Mbit/s, at most 5 s: a peer
  // that takes nothing (stopped, its link cut) delays this rank's exit by that much at most.
  const double grace = std::min(5.0, 0.25 + static_cast<double>(most) / 12.5e6);
  const Clock::time_point deadline = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(grace * 1e6));
  std::vector<pollfd> polls;
  while (true) {
    polls.clear();
    for (Out& o : outs) {
      if (o.done) continue;
      WriteSome(o.fd, &o.iov, &o.done);
      if (o.done || !o.iov.empty()) continue;
      int unacknowledged = 0;  // everything written: the sending side closes, the peer acknowledges
      ::shutdown(o.fd, SHUT_WR);
      o.done = ::ioctl(o.fd, SIOCOUTQ, &unacknowledged) != 0 || unacknowledged == 0;
    }
    for (const Out& o : outs) {
      if (!o.done) polls.push_back(pollfd{o.fd, static_cast<short>(POLLIN | (o.iov.empty() ? 0 : POLLOUT)), 0});
    }
    const int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (polls.empty() || left <= 0) break;
    if (::poll(polls.data(), polls.size(), static_cast<int>(std::min<int64_t>(left, 5))) <= 0) continue;
    for (const pollfd& pf : polls) {
      // What the peer sends meanwhile is dropped, so that two ranks failing at once never block
      // each other on full buffers; a peer that closed its end needs nothing more.
      char drop[65536];
      bool gone = (pf.revents & (POLLERR | POLLHUP)) != 0;
      if (pf.revents & POLLIN) gone = gone || ::recv(pf.fd, drop, sizeof drop, MSG_DONTWAIT) == 0;
      if (gone) {
        for (Out& o : outs) o.done = o.done || o.fd == pf.fd;
      }
    }
  }
  for (const Out& o : outs) ::shutdown(o.fd, SHUT_WR);
}

void Mesh::Fail(const std::string& text) {
  Abort(text, true);
  throw Error(text);
}

std::string Mesh::Lost(int peer, const std::string& doing) const {
  return "tcp communicator: rank " + std::to_string(rank_) + " lost its connection to rank " +
         std::to_string(peer) + " while " + doing + " (rank " + std::to_string(peer) +
         " exited or failed without saying why)";
}

std::string Mesh::Unreachable(int peer, const std::string& doing) const {
  std::ostringstream seconds;
  seconds << unreachable_seconds_;
  return "tcp communicator: rank " + std::to_string(rank_) + " cannot reach rank " + std::to_string(peer) + " while " +
         doing + ": rank " + std::to_string(peer) + "'s host acknowledged nothing for " + seconds.str() +
         " s (half of GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS): the network between their hosts is down or drops "
         "everything";
}

}  // namespace tcp
}  // namespace gradcomp
