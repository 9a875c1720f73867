#include "ops/comm/tcp_mesh.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ops/common/enforce.h"

namespace gradcomp {
namespace tcp {

namespace {

// The errors of a connection whose peer's host stopped answering (TcpOptions::unreachable_seconds
// ran out): ETIMEDOUT, or the soft error the kernel met meanwhile (no route once a link is down).
bool Unanswered(int err) { return err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETUNREACH; }

}  // namespace

Mesh::~Mesh() {
  for (Peer& p : peers_) {
    if (p.fd >= 0) ::close(p.fd);
  }
}

OpPtr Mesh::PostSend(int peer, uint32_t context, int tag, const void* data, size_t bytes) {
  CheckUsable(peer, "send to");
  auto op = std::make_shared<Op>();
  op->send = true;
  op->peer = peer;
  op->context = context;
  op->tag = tag;
  op->data = static_cast<char*>(const_cast<void*>(data));
  op->bytes = bytes;
  op->header = Header{context, tag, bytes};
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (peer == rank_) {
    SendToSelf(op);
    return op;
  }
  if (p.closed) Fail(Lost(peer, "sending " + std::to_string(bytes) + " bytes"));
  p.sends.push_back(op);
  if (p.sends.size() == 1) Write(peer);
  return op;
}

OpPtr Mesh::PostRecv(int peer, uint32_t context, int tag, void* data, size_t bytes) {
  CheckUsable(peer, "receive from");
  auto op = std::make_shared<Op>();
  op->peer = peer;
  op->context = context;
  op->tag = tag;
  op->data = static_cast<char*>(data);
  op->bytes = bytes;
  Peer& p = peers_[static_cast<size_t>(peer)];
  for (auto it = p.unexpected.begin(); it != p.unexpected.end(); ++it) {
    if (it->claimed || it->context != context || it->tag != tag) continue;
    CheckSize(peer, *op, it->data.size());
    if (it->complete) {
      if (bytes > 0) std::memcpy(data, it->data.data(), bytes);
      p.unexpected.erase(it);
      op->complete = true;
    } else {
      it->claimed = op;
    }
    return op;
  }
  if (p.closed) Fail(Lost(peer, "receiving " + std::to_string(bytes) + " bytes"));
  p.recvs.push_back(op);
  return op;
}

bool Mesh::Test(const Op& op) {
  CheckFailed();
  if (!op.complete) Pump(0);
  return op.complete;
}

bool Mesh::Arrived(int peer, uint32_t context, int tag) const {
  for (const Unexpected& u : peers_[static_cast<size_t>(peer)].unexpected) {
    if (!u.claimed && u.context == context && u.tag == tag) return true;
  }
  return false;
}

void Mesh::WaitForProgress(double seconds, int wake_fd) {
  CheckFailed();
  Pump(seconds, wake_fd);
}

void Mesh::Wait(const std::vector<OpPtr>& ops) {
  while (true) {
    CheckFailed();
    const Op* waiting = nullptr;
    for (const OpPtr& op : ops) {
      if (!op->complete) {
        waiting = op.get();
        break;
      }
    }
    if (waiting == nullptr) return;
    if (peers_[static_cast<size_t>(waiting->peer)].closed) {
      Fail(Lost(waiting->peer, std::string(waiting->send ? "sending " : "receiving ") +
                                   std::to_string(waiting->bytes) + " bytes"));
    }
    Pump(-1);
  }
}

void Mesh::CheckFailed() const {
  if (!failed_.empty()) throw Error(failed_);
}

void Mesh::CheckUsable(int peer, const char* what) const {
  CheckFailed();
  if (peer < 0 || peer >= size()) {
    throw InvalidArgument("tcp communicator: rank " + std::to_string(rank_) + " cannot " + what + " rank " +
                          std::to_string(peer) + " (world of " + std::to_string(size()) + ")");
  }
}

void Mesh::CheckSize(int peer, const Op& op, size_t arrived) {
  if (arrived == op.bytes) return;
  Fail("tcp communicator: rank " + std::to_string(rank_) + " expected " + std::to_string(op.bytes) +
       " bytes from rank " + std::to_string(peer) + " (context " + std::to_string(op.context) + ", tag " +
       std::to_string(op.tag) + ") and got a message of " + std::to_string(arrived));
}

void Mesh::Pump(double timeout, int wake_fd) {
  polls_.clear();
  index_.clear();
  if (wake_fd >= 0) {
    polls_.push_back(pollfd{wake_fd, POLLIN, 0});
    index_.push_back(-1);
  }
  for (size_t p = 0; p < peers_.size(); ++p) {
    const Peer& peer = peers_[p];
    if (peer.fd < 0 || peer.closed) continue;
    short events = POLLIN;
    if (!peer.sends.empty()) events |= POLLOUT;
    polls_.push_back(pollfd{peer.fd, events, 0});
    index_.push_back(static_cast<int>(p));
  }
  if (polls_.empty()) return;
  timespec wait{};
  if (timeout > 0) {
    wait.tv_sec = static_cast<time_t>(timeout);
    wait.tv_nsec = static_cast<long>((timeout - static_cast<double>(wait.tv_sec)) * 1e9);
  }
  int ready;
  do {
    ready = ::ppoll(polls_.data(), polls_.size(), timeout < 0 ? nullptr : &wait, nullptr);
  } while (ready < 0 && errno == EINTR);
  if (ready < 0) Fail("tcp communicator: poll() failed on rank " + std::to_string(rank_) + ": " + ErrnoText(errno));
  for (size_t i = 0; i < polls_.size() && ready > 0; ++i) {
    if (polls_[i].revents == 0) continue;
    if (index_[i] < 0) {  // the waiter's eventfd: reset it
      uint64_t count;
      (void)!::read(wake_fd, &count, sizeof count);
      continue;
    }
    if (polls_[i].revents & POLLOUT) Write(index_[i]);
    if (polls_[i].revents & (POLLIN | POLLHUP | POLLERR)) Read(index_[i]);
  }
}

void Mesh::Write(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  while (!p.sends.empty() && !p.closed) {
    Op& op = *p.sends.front();
    const size_t total = sizeof(Header) + op.bytes;
    iovec iov[2];
    const int n = FrameRest(op, iov);
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t wrote = ::sendmsg(p.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (wrote < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      const int err = errno;
      if (Unanswered(err)) Fail(Unreachable(peer, "sending " + std::to_string(op.bytes) + " bytes"));
      if (err == EPIPE || err == ECONNRESET) {
        Read(peer);  // the peer may have said why before it closed (Read throws its reason)
        p.closed = true;
        Fail(Lost(peer, "sending " + std::to_string(op.bytes) + " bytes"));
      }
      Fail("tcp communicator: rank " + std::to_string(rank_) + " could not send to rank " + std::to_string(peer) +
           ": " + ErrnoText(err));
    }
    op.done += static_cast<size_t>(wrote);
    if (op.done < total) return;
    op.complete = true;
    p.sends.pop_front();
  }
}

void Mesh::Read(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  while (!p.closed) {
    char* into;
    size_t want;
    if (p.header_got < sizeof(Header)) {
      into = reinterpret_cast<char*>(&p.header) + p.header_got;
      want = sizeof(Header) - p.header_got;
    } else {
      into = PayloadAt(p) + p.payload_got;
      want = p.header.bytes - p.payload_got;
    }
    const ssize_t got = ::recv(p.fd, into, want, MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      if (Unanswered(errno)) Fail(Unreachable(peer, p.header_got > 0 ? "receiving a message" : "waiting for it"));
      if (errno != ECONNRESET) {
        Fail("tcp communicator: rank " + std::to_string(rank_) + " could not receive from rank " +
             std::to_string(peer) + ": " + ErrnoText(errno));
      }
    }
    if (got <= 0) {  // the peer closed its end
      p.closed = true;
      const bool mid_frame = p.header_got > 0;
      if (mid_frame || !p.recvs.empty() || !p.sends.empty() || Claimed(p)) {
        Fail(Lost(peer, mid_frame ? "receiving a message" : "waiting for it"));
      }
      return;
    }
    if (p.header_got < sizeof(Header)) {
      p.header_got += static_cast<size_t>(got);
      if (p.header_got == sizeof(Header)) StartPayload(peer);
    } else {
      p.payload_got += static_cast<size_t>(got);
    }
    if (p.header_got == sizeof(Header) && p.payload_got == p.header.bytes) FinishFrame(peer);
  }
}

void Mesh::SendToSelf(const OpPtr& op) {
  Peer& self = peers_[static_cast<size_t>(rank_)];
  for (auto it = self.recvs.begin(); it != self.recvs.end(); ++it) {
    Op& r = **it;
    if (r.context != op->context || r.tag != op->tag) continue;
    CheckSize(rank_, r, op->bytes);
    if (op->bytes > 0) std::memcpy(r.data, op->data, op->bytes);
    r.complete = true;
    self.recvs.erase(it);
    op->complete = true;
    return;
  }
  Unexpected u;
  u.context = op->context;
  u.tag = op->tag;
  u.data.assign(op->data, op->data + op->bytes);
  u.complete = true;
  self.unexpected.push_back(std::move(u));
  op->complete = true;
}

bool Mesh::Claimed(const Peer& p) {
  for (const Unexpected& u : p.unexpected) {
    if (u.claimed) return true;
  }
  return false;
}

char* Mesh::PayloadAt(Peer& p) {
  if (p.aborting) return &p.abort_text[0];
  if (p.target) return p.target->data;
  return p.buffer->data.data();
}

void Mesh::StartPayload(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  p.payload_got = 0;
  if (p.header.context == kAbortContext) {
    p.aborting = true;
    p.abort_text.assign(std::min<uint64_t>(p.header.bytes, kMaxAbortText), '\0');
    p.header.bytes = p.abort_text.size();
    return;
  }
  for (auto it = p.recvs.begin(); it != p.recvs.end(); ++it) {
    Op& op = **it;
    if (op.context != p.header.context || op.tag != p.header.tag) continue;
    CheckSize(peer, op, p.header.bytes);
    p.target = *it;
    p.recvs.erase(it);
    return;
  }
  Unexpected u;
  u.context = p.header.context;
  u.tag = p.header.tag;
  u.data.resize(p.header.bytes);
  p.unexpected.push_back(std::move(u));
  p.buffer = std::prev(p.unexpected.end());
  p.buffered = true;
}

void Mesh::FinishFrame(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  p.header_got = 0;
  p.payload_got = 0;
  if (p.aborting) {
    p.aborting = false;
    p.closed = true;
    Fail(p.abort_text);
  }
  if (p.target) {
    p.target->complete = true;
    p.target.reset();
  } else if (p.buffered) {
    p.buffered = false;
    Unexpected& u = *p.buffer;
    u.complete = true;
    if (u.claimed) {
      if (!u.data.empty()) std::memcpy(u.claimed->data, u.data.data(), u.data.size());
      u.claimed->complete = true;
      p.unexpected.erase(p.buffer);
    }
  }
}

}  // namespace tcp
}  // namespace gradcomp
