#include "ops/comm/tcp_communicator.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "ops/comm/net_interfaces.h"
#include "ops/common/enforce.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {
namespace {

using Clock = std::chrono::steady_clock;

// Frames: a header, then `bytes` bytes of payload. Contexts separate communicators (and, in
// each, point-to-point from collective traffic); the abort context carries a failure's text.
struct Header {
  uint32_t context;
  int32_t tag;
  uint64_t bytes;
};
static_assert(sizeof(Header) == 16, "the frame header is 16 bytes on the wire");
constexpr uint32_t kAbortContext = 0xffffffffu;
constexpr size_t kMaxAbortText = 4096;
constexpr int kCollectiveTag = 0;

// The first bytes each side of a new connection sends.
struct Hello {
  uint64_t magic;
  uint64_t token;  // the job's, drawn by rank 0
  int32_t rank;    // the sender's
  int32_t size;
  int32_t to;      // the rank the sender means to reach
  int32_t unused;
};
constexpr uint64_t kHelloMagic = 0x3130307063746367ull;  // "gctcp001"

std::string ErrnoText(int err) { return std::string(std::strerror(err)); }

// A posted send or receive.
struct Op {
  bool send = false;
  int peer = 0;  // world rank
  uint32_t context = 0;
  int tag = 0;
  char* data = nullptr;
  size_t bytes = 0;
  Header header{};  // sends: the frame's header
  size_t done = 0;  // sends: header and payload bytes written
  bool complete = false;
};
using OpPtr = std::shared_ptr<Op>;

// A message that arrived before a receive asked for it.
struct Unexpected {
  uint32_t context = 0;
  int tag = 0;
  std::vector<char> data;
  bool complete = false;
  OpPtr claimed;  // a receive posted while it was still arriving
};

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

// What is left to write of a send's frame (header, then payload) after op.done bytes: one or
// two pieces into iov, their number returned.
int FrameRest(Op& op, iovec iov[2]) {
  if (op.done >= sizeof(Header)) {
    iov[0] = {op.data + (op.done - sizeof(Header)), sizeof(Header) + op.bytes - op.done};
    return 1;
  }
  iov[0] = {reinterpret_cast<char*>(&op.header) + op.done, sizeof(Header) - op.done};
  iov[1] = {op.data, op.bytes};
  return op.bytes > 0 ? 2 : 1;
}

// Writes what a nonblocking socket takes of `iov`, dropping the written bytes from it; sets
// *gone when the connection failed (the peer closed or reset it).
void WriteSome(int fd, std::vector<iovec>* iov, bool* gone) {
  while (!iov->empty()) {
    msghdr msg{};
    msg.msg_iov = iov->data();
    msg.msg_iovlen = iov->size();
    const ssize_t wrote = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      *gone = errno != EAGAIN && errno != EWOULDBLOCK;
      return;
    }
    for (size_t left = static_cast<size_t>(wrote); !iov->empty() && (left > 0 || iov->front().iov_len == 0);) {
      iovec& first = iov->front();
      const size_t step = std::min(left, first.iov_len);
      first.iov_base = static_cast<char*>(first.iov_base) + step;
      first.iov_len -= step;
      left -= step;
      if (first.iov_len == 0) iov->erase(iov->begin());
    }
    if (wrote == 0) return;
  }
}

// The connections of one process to every other rank of the world, shared by the world's
// communicator and its splits. Single-threaded, like every communicator here.
class Mesh {
 public:
  Mesh(int rank, std::vector<int> fds) : rank_(rank), peers_(fds.size()) {
    for (size_t p = 0; p < fds.size(); ++p) peers_[p].fd = fds[p];
  }
  ~Mesh() {
    for (Peer& p : peers_) {
      if (p.fd >= 0) ::close(p.fd);
    }
  }
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(peers_.size()); }
  uint32_t next_context = 2;  // the world uses 0 (point-to-point) and 1 (collectives)

  OpPtr PostSend(int peer, uint32_t context, int tag, const void* data, size_t bytes) {
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

  OpPtr PostRecv(int peer, uint32_t context, int tag, void* data, size_t bytes) {
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

  /// Advances every connection without blocking; true once `op` completed.
  bool Test(const Op& op) {
    CheckFailed();
    if (!op.complete) Pump(0);
    return op.complete;
  }

  /// Waits up to `seconds` for a connection to become readable (or writable, with sends
  /// pending) or `wake_fd` readable (then read), moving what it can: a polling loop's nap that
  /// ends when bytes arrive or the loop's pipeline finishes a task.
  void WaitForProgress(double seconds, int wake_fd) {
    CheckFailed();
    Pump(seconds, wake_fd);
  }

  /// Blocks in poll() until every op completed.
  void Wait(const std::vector<OpPtr>& ops) {
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

  /// Sends `text` to every peer that can take it, then closes the sending side of every
  /// connection; every later call throws Error(text). Waits (a bounded time, every peer at once)
  /// until each peer has acknowledged what it was sent: this process may exit next, and closing a
  /// socket with unread bytes in it resets the connection, which can drop what the peer has not
  /// acknowledged yet. finish_frames: the buffers of the sends in flight are still alive (a
  /// failure met inside an operation), so a peer in the middle of one of this rank's frames gets
  /// the rest of it, then the reason; otherwise (AbortTcpWorld: the operation may have unwound)
  /// that peer gets no reason and sees the stream end mid-frame, blaming this rank.
  void Abort(const std::string& text, bool finish_frames) {
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

 private:
  void CheckFailed() const {
    if (!failed_.empty()) throw Error(failed_);
  }
  void CheckUsable(int peer, const char* what) const {
    CheckFailed();
    if (peer < 0 || peer >= size()) {
      throw InvalidArgument("tcp communicator: rank " + std::to_string(rank_) + " cannot " + what + " rank " +
                            std::to_string(peer) + " (world of " + std::to_string(size()) + ")");
    }
  }
  void CheckSize(int peer, const Op& op, size_t arrived) {
    if (arrived == op.bytes) return;
    Fail("tcp communicator: rank " + std::to_string(rank_) + " expected " + std::to_string(op.bytes) +
         " bytes from rank " + std::to_string(peer) + " (context " + std::to_string(op.context) + ", tag " +
         std::to_string(op.tag) + ") and got a message of " + std::to_string(arrived));
  }
  std::string Lost(int peer, const std::string& doing) const {
    return "tcp communicator: rank " + std::to_string(rank_) + " lost its connection to rank " +
           std::to_string(peer) + " while " + doing + " (rank " + std::to_string(peer) +
           " exited or failed without saying why)";
  }
  // A failure met inside an operation: the buffers of the sends in flight are alive.
  [[noreturn]] void Fail(const std::string& text) {
    Abort(text, true);
    throw Error(text);
  }

  // One round of I/O: waits up to `timeout` seconds (negative: until something happens) for a
  // socket to be readable or writable, then reads and writes what it can on those.
  void Pump(double timeout, int wake_fd = -1) {
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

  void Write(int peer) {
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

  void Read(int peer) {
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

  // A message to this rank itself: straight into a posted receive, else kept until one comes.
  void SendToSelf(const OpPtr& op) {
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

  static bool Claimed(const Peer& p) {
    for (const Unexpected& u : p.unexpected) {
      if (u.claimed) return true;
    }
    return false;
  }

  char* PayloadAt(Peer& p) {
    if (p.aborting) return &p.abort_text[0];
    if (p.target) return p.target->data;
    return p.buffer->data.data();
  }

  // A header arrived: decide where its payload goes.
  void StartPayload(int peer) {
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

  void FinishFrame(int peer) {
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

  int rank_;
  std::vector<Peer> peers_;
  std::string failed_;
  std::vector<pollfd> polls_;
  std::vector<int> index_;
};

class TcpTransfer : public PendingTransfer {
 public:
  TcpTransfer(std::shared_ptr<Mesh> mesh, OpPtr op) : mesh_(std::move(mesh)), op_(std::move(op)) {}
  ~TcpTransfer() override {
    if (op_->complete) return;
    try {
      mesh_->Wait({op_});
    } catch (const std::exception&) {
      // The failure reached every rank through the abort; a destructor cannot report it.
    }
  }
  bool Test() override { return mesh_->Test(*op_); }

 private:
  std::shared_ptr<Mesh> mesh_;
  OpPtr op_;
};

class TcpCommunicator : public Communicator {
 public:
  // `members[r]` is the world rank of this communicator's rank r; contexts `context` (point to
  // point) and `context + 1` (collectives).
  TcpCommunicator(std::shared_ptr<Mesh> mesh, uint32_t context, std::vector<int> members, int rank)
      : mesh_(std::move(mesh)), context_(context), members_(std::move(members)), rank_(rank) {}

  Mesh& mesh() { return *mesh_; }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const char* kind() const override { return "tcp"; }
  bool nonblocking() const override { return true; }
  void WaitForProgress(double seconds, int wake_fd) override { mesh_->WaitForProgress(seconds, wake_fd); }
  bool wakes_waiters() const override { return true; }

  void Send(const void* data, size_t bytes, int peer, int tag) override {
    mesh_->Wait({mesh_->PostSend(World(peer), context_, tag, data, bytes)});
  }
  void Recv(void* data, size_t bytes, int peer, int tag) override {
    mesh_->Wait({mesh_->PostRecv(World(peer), context_, tag, data, bytes)});
  }
  void SendRecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes, int src,
                int tag) override {
    OpPtr r = mesh_->PostRecv(World(src), context_, tag, recv, recv_bytes);
    OpPtr s = mesh_->PostSend(World(dst), context_, tag, send, send_bytes);
    mesh_->Wait({r, s});
  }
  std::unique_ptr<PendingTransfer> Isend(const void* data, size_t bytes, int peer, int tag) override {
    return std::make_unique<TcpTransfer>(mesh_, mesh_->PostSend(World(peer), context_, tag, data, bytes));
  }
  std::unique_ptr<PendingTransfer> Irecv(void* data, size_t bytes, int peer, int tag) override {
    return std::make_unique<TcpTransfer>(mesh_, mesh_->PostRecv(World(peer), context_, tag, data, bytes));
  }

  void Barrier() override {
    uint8_t flag = 1;
    Allreduce(&flag, &flag, 1, DataType::kUInt8, ReduceOp::kMax);
  }

  // Recursive doubling; with n not a power of two, the first 2 * (n - p2) ranks fold in pairs
  // first and the even ones get the result at the end (MPICH's scheme). Each pair reduces the
  // lower rank's operand first, so every rank ends with the same bits.
  void Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) override {
    const size_t bytes = count * DataTypeSize(dtype);
    if (in != out && bytes > 0) std::memmove(out, in, bytes);
    const int n = size();
    if (n == 1) return;
    std::vector<char> theirs(bytes);
    int p2 = 1;
    while (p2 * 2 <= n) p2 *= 2;
    const int rem = n - p2;
    int vrank = rank_ - rem;
    if (rank_ < 2 * rem) {
      if (rank_ % 2 == 0) {
        CollSend(rank_ + 1, out, bytes);
        vrank = -1;
      } else {
        CollRecv(rank_ - 1, theirs.data(), bytes);
        Combine(out, theirs.data(), true, count, dtype, op);
        vrank = rank_ / 2;
      }
    }
    if (vrank >= 0) {
      for (int mask = 1; mask < p2; mask <<= 1) {
        const int vpeer = vrank ^ mask;
        const int peer = vpeer < rem ? vpeer * 2 + 1 : vpeer + rem;
        OpPtr r = mesh_->PostRecv(World(peer), context_ + 1, kCollectiveTag, theirs.data(), bytes);
        OpPtr s = mesh_->PostSend(World(peer), context_ + 1, kCollectiveTag, out, bytes);
        mesh_->Wait({r, s});
        Combine(out, theirs.data(), peer < rank_, count, dtype, op);
      }
    }
    if (rank_ < 2 * rem) {
      if (rank_ % 2 == 1) {
        CollSend(rank_ - 1, out, bytes);
      } else {
        CollRecv(rank_ + 1, out, bytes);
      }
    }
  }

  // Direct: each rank sends every peer its slice and reduces the n - 1 it receives, in rank
  // order (the same order whatever arrives first). One message per peer and no relaying: the
  // bytes a rank sends are the (n - 1) / n of its buffer a reduce-scatter must send.
  void ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override {
    GC_ENFORCE(counts.size() == members_.size(), "tcp ReduceScatter: ", counts.size(), " counts for ", size(),
               " ranks");
    const size_t elem = DataTypeSize(dtype), mine = static_cast<size_t>(rank_), n = members_.size();
    const std::vector<size_t> offsets = Offsets(counts);
    const char* src = static_cast<const char*>(in);
    const size_t my_bytes = counts[mine] * elem;
    std::vector<char> theirs((n - 1) * my_bytes);
    const auto slot = [&](size_t r) { return theirs.data() + (r < mine ? r : r - 1) * my_bytes; };
    std::vector<size_t> send_bytes(n);
    for (size_t r = 0; r < n; ++r) send_bytes[r] = counts[r] * elem;
    ExchangeWithAll(slot, std::vector<size_t>(n, my_bytes), [&](size_t r) { return src + offsets[r] * elem; },
                    send_bytes);
    if (my_bytes == 0) return;
    const auto part = [&](size_t r) -> const char* { return r == mine ? src + offsets[mine] * elem : slot(r); };
    std::memcpy(out, part(0), my_bytes);
    for (size_t r = 1; r < n; ++r) ReduceInto(out, part(r), counts[mine], dtype, op);
  }

  // Direct: every rank sends its part to every peer at once.
  void Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override {
    GC_ENFORCE(bytes.size() == members_.size(), "tcp Allgatherv: ", bytes.size(), " sizes for ", size(), " ranks");
    const std::vector<size_t> offsets = Offsets(bytes);
    const size_t mine = static_cast<size_t>(rank_);
    char* base = static_cast<char*>(out);
    if (bytes[mine] > 0 && base + offsets[mine] != in) std::memmove(base + offsets[mine], in, bytes[mine]);
    ExchangeWithAll([&](size_t r) { return base + offsets[r]; }, bytes, [&](size_t) { return base + offsets[mine]; },
                    std::vector<size_t>(bytes.size(), bytes[mine]));
  }

  void Gatherv(const void* in, void* out, const std::vector<size_t>& bytes, int root) override {
    CheckRoot(root, "Gatherv");
    GC_ENFORCE(bytes.size() == members_.size(), "tcp Gatherv: ", bytes.size(), " sizes for ", size(), " ranks");
    if (rank_ != root) {
      CollSend(root, in, bytes[static_cast<size_t>(rank_)]);
      return;
    }
    const std::vector<size_t> offsets = Offsets(bytes);
    char* base = static_cast<char*>(out);
    std::vector<OpPtr> ops;
    for (int r = 0; r < size(); ++r) {
      const size_t i = static_cast<size_t>(r);
      if (r == rank_) {
        if (bytes[i] > 0 && base + offsets[i] != in) std::memmove(base + offsets[i], in, bytes[i]);
        continue;
      }
      ops.push_back(mesh_->PostRecv(World(r), context_ + 1, kCollectiveTag, base + offsets[i], bytes[i]));
    }
    mesh_->Wait(ops);
  }

  // Binomial tree from the root.
  void Broadcast(void* data, size_t bytes, int root) override {
    CheckRoot(root, "Broadcast");
    const int n = size();
    const int vrank = (rank_ - root + n) % n;
    int mask = 1;
    while (mask < n) {
      if (vrank & mask) {
        CollRecv((vrank - mask + root) % n, data, bytes);
        break;
      }
      mask <<= 1;
    }
    std::vector<OpPtr> sends;
    for (mask >>= 1; mask > 0; mask >>= 1) {
      if (vrank + mask < n) {
        sends.push_back(mesh_->PostSend(World((vrank + mask + root) % n), context_ + 1, kCollectiveTag, data, bytes));
      }
    }
    mesh_->Wait(sends);
  }

  void Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes) override {
    GC_ENFORCE(send_bytes.size() == members_.size() && recv_bytes.size() == members_.size(),
               "tcp Alltoallv: sizes for ", send_bytes.size(), " and ", recv_bytes.size(), " ranks in a world of ",
               size());
    const std::vector<size_t> soff = Offsets(send_bytes), roff = Offsets(recv_bytes);
    const char* src = static_cast<const char*>(in);
    char* dst = static_cast<char*>(out);
    const size_t mine = static_cast<size_t>(rank_);
    GC_ENFORCE(send_bytes[mine] == recv_bytes[mine], "tcp Alltoallv: rank ", rank_, " sends itself ",
               send_bytes[mine], " bytes and expects ", recv_bytes[mine]);
    if (send_bytes[mine] > 0) std::memcpy(dst + roff[mine], src + soff[mine], send_bytes[mine]);
    ExchangeWithAll([&](size_t r) { return dst + roff[r]; }, recv_bytes, [&](size_t r) { return src + soff[r]; },
                    send_bytes);
  }

  std::unique_ptr<Communicator> Split(int color, int key) override {
    const size_t n = members_.size();
    const int32_t mine[2] = {color, key};
    std::vector<int32_t> all(2 * n);
    Allgatherv(mine, all.data(), std::vector<size_t>(n, sizeof mine));
    // Fresh contexts for every member: above any context a member already uses.
    int64_t base = mesh_->next_context;
    Allreduce(&base, &base, 1, DataType::kInt64, ReduceOp::kMax);
    std::set<int32_t> colors;
    for (size_t r = 0; r < n; ++r) {
      if (all[2 * r] >= 0) colors.insert(all[2 * r]);
    }
    mesh_->next_context = static_cast<uint32_t>(base + 2 * static_cast<int64_t>(colors.size()));
    if (color < 0) return nullptr;
    std::vector<std::pair<std::pair<int32_t, int>, int>> group;  // ((key, rank), rank)
    for (size_t r = 0; r < n; ++r) {
      if (all[2 * r] == color) group.push_back({{all[2 * r + 1], static_cast<int>(r)}, static_cast<int>(r)});
    }
    std::sort(group.begin(), group.end());
    std::vector<int> members;
    int new_rank = 0;
    for (const auto& g : group) {
      if (g.second == rank_) new_rank = static_cast<int>(members.size());
      members.push_back(members_[static_cast<size_t>(g.second)]);
    }
    const auto index = std::distance(colors.begin(), colors.find(color));
    return std::make_unique<TcpCommunicator>(mesh_, static_cast<uint32_t>(base + 2 * index), std::move(members),
                                             new_rank);
  }

  std::unique_ptr<Communicator> SplitLocal(int forced_local_size) override {
    if (forced_local_size > 0) return Split(rank_ / forced_local_size, rank_);
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const std::vector<std::string> hosts = AllgatherStrings(*this, host);
    const int color = static_cast<int>(std::find(hosts.begin(), hosts.end(), std::string(host)) - hosts.begin());
    return Split(color, rank_);
  }

 private:
  int World(int peer) const {
    if (peer < 0 || peer >= size()) {
      throw InvalidArgument("tcp communicator: rank " + std::to_string(peer) + " is not in a group of " +
                            std::to_string(size()));
    }
    return members_[static_cast<size_t>(peer)];
  }
  void CheckRoot(int root, const char* op) const {
    if (root < 0 || root >= size()) {
      throw InvalidArgument(std::string("tcp ") + op + ": root " + std::to_string(root) + " is not in a group of " +
                            std::to_string(size()));
    }
  }
  // Receives recv_bytes[r] bytes at recv_at(r) from every other rank r and sends it
  // send_bytes[r] bytes from send_at(r), every transfer posted at once (receives first).
  void ExchangeWithAll(const std::function<char*(size_t)>& recv_at, const std::vector<size_t>& recv_bytes,
                       const std::function<const char*(size_t)>& send_at, const std::vector<size_t>& send_bytes) {
    std::vector<OpPtr> ops;
    for (int r = 0; r < size(); ++r) {
      const size_t i = static_cast<size_t>(r);
      if (r != rank_) ops.push_back(mesh_->PostRecv(World(r), context_ + 1, kCollectiveTag, recv_at(i), recv_bytes[i]));
    }
    for (int r = 0; r < size(); ++r) {
      const size_t i = static_cast<size_t>(r);
      if (r != rank_) ops.push_back(mesh_->PostSend(World(r), context_ + 1, kCollectiveTag, send_at(i), send_bytes[i]));
    }
    mesh_->Wait(ops);
  }
  void CollSend(int peer, const void* data, size_t bytes) {
    mesh_->Wait({mesh_->PostSend(World(peer), context_ + 1, kCollectiveTag, data, bytes)});
  }
  void CollRecv(int peer, void* data, size_t bytes) {
    mesh_->Wait({mesh_->PostRecv(World(peer), context_ + 1, kCollectiveTag, data, bytes)});
  }
  // mine = (lower rank's operand) op (higher's); `theirs_first`: the peer is the lower rank.
  static void Combine(void* mine, void* theirs, bool theirs_first, size_t count, DataType dtype, ReduceOp op) {
    if (count == 0) return;  // empty buffers may be null
    if (theirs_first) {
      ReduceInto(theirs, mine, count, dtype, op);
      std::memcpy(mine, theirs, count * DataTypeSize(dtype));
    } else {
      ReduceInto(mine, theirs, count, dtype, op);
    }
  }

  std::shared_ptr<Mesh> mesh_;
  uint32_t context_;
  std::vector<int> members_;
  int rank_;
};

// ---- Connecting ----

void SetNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int MillisLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, 1 << 30)));
}

// Waits for `events` on fd until the deadline; false on timeout.
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int ready = ::poll(&p, 1, MillisLeft(deadline));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Moves exactly `bytes` through a nonblocking socket before the deadline; false (with `why`) if not.
bool Exchange(int fd, char* data, size_t bytes, bool send, Clock::time_point deadline, std::string* why) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = send ? ::send(fd, data + done, bytes - done, MSG_NOSIGNAL) : ::recv(fd, data + done, bytes - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      *why = "the connection closed during the greeting";
      return false;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      *why = ErrnoText(errno);
      return false;
    }
    if (!WaitFor(fd, send ? POLLOUT : POLLIN, deadline)) {
      *why = "no greeting in time";
      return false;
    }
  }
  return true;
}

// Appends "address:port: why" to a "; "-separated list of failed attempts.
void AddFailure(std::string* failures, const std::string& address, uint16_t port, const std::string& why) {
  *failures += (failures->empty() ? "" : "; ") + address + ":" + std::to_string(port) + ": " + why;
}

// How long a connection attempt to one of a peer's addresses runs alone before the next address
// is tried beside it, and how long an attempt may take at all.
constexpr auto kStagger = std::chrono::milliseconds(250);
constexpr auto kAttempt = std::chrono::seconds(5);

// Opens a TCP connection to the first of the addresses in `left` (in order) that answers, on
// `port`: each address gets an attempt of its own, the next one starting beside it when it has
// not connected within kStagger or has failed, as in happy eyeballs (RFC 8305), so an address
// whose packets are dropped costs kStagger instead of a connect timeout. Returns the socket
// (and its address in *at, taken out of `left`) or -1. Addresses that failed are taken out of
// `left` and listed in *failures with why; those still connecting when another one won stay in
// `left` (listed as not answering in time), to be tried again should the winner's greeting fail.
int ConnectFirst(std::vector<std::string>* left, uint16_t port, Clock::time_point deadline, std::string* at,
                 std::string* failures) {
  struct Attempt {
    int fd;
    std::string address;
    Clock::time_point until;
  };
  const std::vector<std::string> order = *left;
  const auto failed = [&](const std::string& address, const std::string& why) {
    AddFailure(failures, address, port, why);
    const auto it = std::find(left->begin(), left->end(), address);
    if (it != left->end()) left->erase(it);
  };
  std::vector<Attempt> flying;
  std::vector<pollfd> polls;
  size_t next = 0;
  Clock::time_point next_start = Clock::now();
  int won = -1;
  while (won < 0) {
    const Clock::time_point now = Clock::now();
    if (now >= deadline) break;
    if (next < order.size() && (flying.empty() || now >= next_start)) {
      const std::string& address = order[next++];
      next_start = now + kStagger;
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_port = htons(port);
      if (::inet_pton(AF_INET, address.c_str(), &sa.sin_addr) != 1) {
        failed(address, "not an IPv4 address");
        continue;
      }
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        failed(address, ErrnoText(errno));
        continue;
      }
      SetNonBlocking(fd);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
        won = fd;
        *at = address;
      } else if (errno == EINPROGRESS) {
        flying.push_back({fd, address, std::min(deadline, now + kAttempt)});
      } else {
        failed(address, ErrnoText(errno));
        ::close(fd);
      }
      continue;
    }
    if (flying.empty()) break;  // every address failed
    Clock::time_point wake = deadline;
    if (next < order.size()) wake = std::min(wake, next_start);
    for (const Attempt& a : flying) wake = std::min(wake, a.until);
    polls.clear();
    for (const Attempt& a : flying) polls.push_back(pollfd{a.fd, POLLOUT, 0});
    const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count() + 1;
    if (::poll(polls.data(), polls.size(), static_cast<int>(std::min<int64_t>(ms, 1 << 30))) < 0 && errno != EINTR) {
      break;
    }
    const Clock::time_point then = Clock::now();
    std::vector<Attempt> still;
    for (size_t i = 0; i < flying.size(); ++i) {
      Attempt& a = flying[i];
      if (won < 0 && polls[i].revents != 0) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(a.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err == 0) {
          won = a.fd;
          *at = a.address;
          continue;
        }
        failed(a.address, ErrnoText(err));
        ::close(a.fd);
        next_start = then;  // a failure starts the next address at once
      } else if (then >= a.until) {
        failed(a.address, "timed out");
        ::close(a.fd);
        next_start = then;
      } else {
        still.push_back(std::move(a));
      }
    }
    flying = std::move(still);
  }
  for (const Attempt& a : flying) {  // slower than the winner (or out of time)
    AddFailure(failures, a.address, port,
               "no answer within " +
                   std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(kStagger).count()) + " ms");
    ::close(a.fd);
  }
  if (won >= 0) {
    const auto it = std::find(left->begin(), left->end(), *at);
    if (it != left->end()) left->erase(it);
  }
  return won;
}

// Greets on a new connection to rank `expect_rank`: true when that rank of this job answered.
bool Greet(int fd, const Hello& mine, int expect_rank, Clock::time_point deadline, std::string* why) {
  SetNoDelay(fd);
  Hello theirs{};
  Hello hello = mine;
  hello.to = expect_rank;
  // The peer answers once it is done connecting to the ranks below it: up to the deadline.
  if (!Exchange(fd, reinterpret_cast<char*>(&hello), sizeof hello, true, deadline, why) ||
      !Exchange(fd, reinterpret_cast<char*>(&theirs), sizeof theirs, false, deadline, why)) {
    return false;
  }
  if (theirs.magic != kHelloMagic || theirs.token != mine.token || theirs.rank != expect_rank ||
      theirs.size != mine.size) {
    *why = "another process answered there (not rank " + std::to_string(expect_rank) + " of this job)";
    return false;
  }
  return true;
}

// The descriptors this process has open now (/proc/self/fd's entries, less the directory's own).
int OpenDescriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  int count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(dir);
  return count - 1;
}

// The mesh holds a socket per peer: at a thousand ranks that is the soft open-file limit many
// systems start a process with (1024), and past it socket() and accept() fail with EMFILE in
// the middle of the connection phase. Raises the soft limit to the hard one when the
// connections would not fit (as Go's runtime does for every program since 1.19; the hard limit
// is the administrator's); returns "" or why they cannot fit, naming the limits. `raised`
// tells the log what was changed.
std::string MakeRoomForConnections(int peers, std::string* raised) {
  constexpr rlim_t kSpare = 64;  // for the rest of the process: MPI's own sockets, files, pipes
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return "";
  const int open = OpenDescriptors();
  const rlim_t needed = static_cast<rlim_t>(open) + static_cast<rlim_t>(peers) + 1;  // and the listener
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= needed + kSpare) return "";
  rlimit want = lim;
  want.rlim_cur = lim.rlim_max;
  if (lim.rlim_max == RLIM_INFINITY) want.rlim_cur = std::max<rlim_t>(needed + kSpare, 1 << 20);  // Linux's nr_open
  if (want.rlim_cur > lim.rlim_cur && ::setrlimit(RLIMIT_NOFILE, &want) == 0) {
    *raised = "raised this process's open-file limit from " + std::to_string(lim.rlim_cur) + " to " +
              std::to_string(want.rlim_cur) + " for its TCP connections to " + std::to_string(peers) + " peers";
    lim = want;
  }
  if (lim.rlim_cur >= needed) return "";
  return "the TCP connections to " + std::to_string(peers) + " peers need " + std::to_string(needed) +
         " open files with the " + std::to_string(open) + " this process has open, and its open-file limit is " +
         std::to_string(lim.rlim_cur) + " (hard limit " +
         (lim.rlim_max == RLIM_INFINITY ? std::string("unlimited") : std::to_string(lim.rlim_max)) +
         "): raise it (ulimit -n, systemd's LimitNOFILE, docker run --ulimit nofile=...)";
}

// "rank 3", "ranks 0-2, 5, 7-9": a large job's ranks named in one line.
std::string RankSet(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + NumberRanges(ranks, ", ");
}

// Every rank's listening address, as "host port addr,addr,...".
struct Endpoint {
  std::string host;
  uint16_t port = 0;
  std::vector<std::string> addresses;
};

Endpoint ParseEndpoint(const std::string& text) {
  Endpoint e;
  std::istringstream in(text);
  std::string addresses;
  in >> e.host >> e.port >> addresses;
  std::istringstream list(addresses);
  for (std::string a; std::getline(list, a, ',');) {
    if (!a.empty()) e.addresses.push_back(a);
  }
  return e;
}

// Takes the calls of every rank above `mine.rank` on `listener` (non-blocking) until they all
// came, the deadline passed or `stop` was set; returns "" or what went wrong.
std::string AcceptAbove(int listener, const Hello& mine, double timeout_seconds, Clock::time_point deadline,
                        std::vector<int>* fds, const std::atomic<bool>& stop) {
  const int rank = mine.rank, n = mine.size;
  Hello hello = mine;
  for (int expected = n - 1 - rank; expected > 0 && !stop;) {
    // In slices, to notice `stop` (the dialing failed) soon.
    const Clock::time_point slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
    if (!WaitFor(listener, POLLIN, slice)) {
      if (Clock::now() < deadline) continue;
      std::vector<int> missing;
      for (int p = rank + 1; p < n; ++p) {
        if ((*fds)[static_cast<size_t>(p)] < 0) missing.push_back(p);
      }
      std::ostringstream timeout;
      timeout << timeout_seconds;
      return RankSet(missing) + " did not connect within " + timeout.str() + " s";
    }
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // The caller's connection stays queued, so retrying would spin until the deadline.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        return "cannot accept the connections of the ranks above it: " + ErrnoText(errno);
      }
      continue;
    }
    SetNoDelay(fd);
    Hello theirs{};
    std::string why;
    const Clock::time_point greeting = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    const bool ok = Exchange(fd, reinterpret_cast<char*>(&theirs), sizeof theirs, false, greeting, &why) &&
                    theirs.magic == kHelloMagic && theirs.token == mine.token && theirs.size == n &&
                    theirs.to == rank && theirs.rank > rank && theirs.rank < n &&
                    (*fds)[static_cast<size_t>(theirs.rank)] < 0 &&
                    Exchange(fd, reinterpret_cast<char*>(&hello), sizeof hello, true, greeting, &why);
    if (!ok) {  // a stranger, or a rank that gave up: keep listening
      ::close(fd);
      continue;
    }
    (*fds)[static_cast<size_t>(theirs.rank)] = fd;
    --expected;
  }
  return "";
}

// This rank's part of the connection phase; returns "" or what went wrong. `elsewhere` tells
// a rank that found nothing wrong itself that some other rank gave up before connecting (its
// own error says why), so that nobody waits for its calls.
std::string ConnectMesh(Communicator& bootstrap, const TcpOptions& options, std::vector<int>* fds, TcpReport* report,
                        bool* elsewhere) {
  const int rank = bootstrap.rank(), n = bootstrap.size();
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options.connect_timeout_seconds * 1000));
  // The job's token, so that a connection that reaches another process is recognised.
  uint64_t token = 0;
  if (rank == 0) {
    std::random_device rd;
    token = (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  }
  bootstrap.Broadcast(&token, sizeof token, 0);

  std::string error = MakeRoomForConnections(n - 1, &report->open_file_limit);
  const int listener = error.empty() ? ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) : -1;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof sa;
  // Ports left in TIME_WAIT by earlier connections stay usable (a job's restart, a test's many worlds).
  int one = 1;
  if (listener >= 0) ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (error.empty() &&
      (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
       ::listen(listener, n) != 0 || ::getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len) != 0)) {
    error = "cannot listen on a TCP port: " + ErrnoText(errno);
  }
  std::vector<NetInterface> interfaces, advertised;
  try {
    if (error.empty()) interfaces = ListNetInterfaces();
  } catch (const Error& e) {
    error = e.what();
  }
  if (error.empty()) {
    advertised = AdvertisedInterfaces(interfaces, options.iface);
    if (advertised.empty()) {
      error = options.iface.empty() ? "no IPv4 address on this host"
                                    : "no IPv4 address on network interface '" + options.iface +
                                          "' (GRADCOMP_CONTROLLER_IFACE)";
    }
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string mine = std::string(host) + " " + std::to_string(error.empty() ? ntohs(sa.sin_port) : 0) + " ";
  for (size_t i = 0; i < advertised.size(); ++i) mine += (i ? "," : "") + advertised[i].address;
  std::vector<Endpoint> endpoints;
  for (const std::string& text : AllgatherStrings(bootstrap, mine)) endpoints.push_back(ParseEndpoint(text));
  // A rank that gave up already (port 0) would never dial the ranks below it: nobody waits, it
  // and the others alike.
  const bool gave_up = std::any_of(endpoints.begin(), endpoints.end(), [](const Endpoint& e) { return e.port == 0; });
  if (gave_up) {
    *elsewhere = error.empty();
    if (listener >= 0) ::close(listener);
    return error;
  }

  Hello hello{kHelloMagic, token, rank, n, rank, 0};
  // Take the calls of every rank above on a thread of its own while dialing every rank below,
  // the nearest first. Dialing first and answering after, as before, chained the ranks: a
  // rank's greeting was answered only once the peer had dialed all of its own, so the phase
  // lasted a round trip per rank in the world; and every rank dialing rank 0 first sent the
  // whole world's calls into rank 0's listen queue at once (net.core.somaxconn: 128 before
  // Linux 5.4, 4096 since), whose overflow costs each dropped call a SYN retry of a second or
  // more. Nearest first, a rank's calls arrive one or two at a time.
  std::atomic<bool> stop{false};
  std::string accept_error;
  std::thread acceptor;
  if (error.empty() && rank + 1 < n) {
    SetNonBlocking(listener);
    acceptor = std::thread([&] {
      accept_error = AcceptAbove(listener, hello, options.connect_timeout_seconds, deadline, fds, stop);
      // Closed at once: calls still queued (accept() failing with EMFILE, say) are reset, and
      // their ranks learn it now rather than at the deadline.
      ::close(listener);
    });
  }
  for (int p = rank - 1; p >= 0 && error.empty(); --p) {
    const Endpoint& e = endpoints[static_cast<size_t>(p)];
    std::vector<std::string> left = DialOrder(e.addresses, e.host == host, interfaces);
    std::string failures;
    while (!left.empty() && (*fds)[static_cast<size_t>(p)] < 0) {
      std::string at, why;
      const int fd = ConnectFirst(&left, e.port, deadline, &at, &failures);
      if (fd < 0) break;
      if (!Greet(fd, hello, p, deadline, &why)) {
        AddFailure(&failures, at, e.port, why);
        ::close(fd);
        continue;
      }
      (*fds)[static_cast<size_t>(p)] = fd;
      if (!failures.empty()) {
        report->detours.push_back("rank " + std::to_string(rank) + " reached rank " + std::to_string(p) + " (host " +
                                  e.host + ") at " + at + " only after " + failures);
      }
    }
    if ((*fds)[static_cast<size_t>(p)] < 0) {
      error = "cannot reach rank " + std::to_string(p) + " (host " + e.host + ") at " +
              (failures.empty() ? std::string("no address") : failures);
    }
  }
  // Every rank's dials are over. A rank's call ends only once its callee has answered, so if
  // every rank reached every rank below it, every call has been taken; if one did not, the world
  // fails anyway and nobody waits for its calls until the deadline (it did, before).
  int dialed = error.empty() ? 1 : 0;
  bootstrap.Allreduce(&dialed, &dialed, 1, DataType::kInt32, ReduceOp::kMin);
  if (!dialed) stop = true;
  if (acceptor.joinable()) {
    acceptor.join();
  } else if (listener >= 0) {
    ::close(listener);
  }
  if (error.empty()) error = accept_error;
  std::set<std::string> used;  // this rank's interfaces towards other hosts
  for (int p = 0; p < n; ++p) {
    const int fd = (*fds)[static_cast<size_t>(p)];
    if (fd < 0) continue;
    SetNonBlocking(fd);
    sockaddr_in local{};
    socklen_t local_len = sizeof local;
    if (endpoints[static_cast<size_t>(p)].host == host ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) {
      continue;
    }
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
    const std::string name = InterfaceOf(text, interfaces);
    used.insert(name.empty() ? std::string(text) : name);
  }
  for (const std::string& name : used) report->interfaces += (report->interfaces.empty() ? "" : ",") + name;
  return error;
}

}  // namespace

std::unique_ptr<Communicator> ConnectTcpWorld(Communicator& bootstrap, const TcpOptions& options, TcpReport* report) {
  const int n = bootstrap.size();
  std::vector<int> fds(static_cast<size_t>(n), -1);
  TcpReport ignored;
  if (report == nullptr) report = &ignored;
  *report = TcpReport();
  bool elsewhere = false;
  const std::string error = n > 1 ? ConnectMesh(bootstrap, options, &fds, report, &elsewhere) : std::string();
  // Every rank learns whether every rank connected, and fails alike if not.
  int ok = error.empty() && !elsewhere ? 1 : 0;
  bootstrap.Allreduce(&ok, &ok, 1, DataType::kInt32, ReduceOp::kMin);
  if (!ok) {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
    const std::vector<std::string> errors = AllgatherStrings(bootstrap, error);
    // Each reason once, with the ranks that gave it (at a thousand ranks, often all of them).
    std::vector<std::pair<std::string, std::vector<int>>> reasons;
    for (size_t r = 0; r < errors.size(); ++r) {
      if (errors[r].empty()) continue;
      auto same = std::find_if(reasons.begin(), reasons.end(), [&](const auto& x) { return x.first == errors[r]; });
      if (same == reasons.end()) same = reasons.insert(reasons.end(), {errors[r], {}});
      same->second.push_back(static_cast<int>(r));
    }
    std::string text = "cannot connect the ranks over TCP:";
    for (const auto& [reason, ranks] : reasons) text += " " + RankSet(ranks) + ": " + reason + ";";
    throw Error(text);
  }
  std::vector<int> members(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) members[static_cast<size_t>(r)] = r;
  return std::make_unique<TcpCommunicator>(std::make_shared<Mesh>(bootstrap.rank(), std::move(fds)), 0,
                                           std::move(members), bootstrap.rank());
}

void AbortTcpWorld(Communicator& comm, const std::string& why) {
  auto* tcp = dynamic_cast<TcpCommunicator*>(&comm);
  if (tcp == nullptr) return;
  tcp->mesh().Abort("tcp communicator: rank " + std::to_string(tcp->mesh().rank()) + " failed: " + why, false);
}

}  // namespace gradcomp
