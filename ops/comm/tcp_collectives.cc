#include "ops/comm/tcp_collectives.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>
#include <string>

#include "ops/common/enforce.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {
namespace tcp {
namespace {

constexpr int kCollectiveTag = 0;

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
  /// The first rank from which a point-to-point message on `tag` has arrived unasked, or -1.
  int ArrivedFrom(int tag) const {
    for (int r = 0; r < size(); ++r) {
      if (mesh_->Arrived(members_[static_cast<size_t>(r)], context_, tag)) return r;
    }
    return -1;
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

// IrecvFromAny's transfer: polls the mesh until some rank's message has arrived, then receives it.
class AnySourceTransfer : public PendingTransfer {
 public:
  AnySourceTransfer(TcpCommunicator& comm, void* data, size_t bytes, int tag, int* source)
      : comm_(comm), data_(data), bytes_(bytes), tag_(tag), source_(source) {}
  bool Test() override {
    if (!chosen_) {
      comm_.WaitForProgress(0, -1);
      const int from = comm_.ArrivedFrom(tag_);
      if (from < 0) return false;
      *source_ = from;
      chosen_ = comm_.Irecv(data_, bytes_, from, tag_);
    }
    return chosen_->Test();
  }

 private:
  TcpCommunicator& comm_;
  void* data_;
  size_t bytes_;
  int tag_;
  int* source_;
  std::unique_ptr<PendingTransfer> chosen_;
};

}  // namespace

std::unique_ptr<PendingTransfer> IrecvFromAny(Communicator& comm, void* data, size_t bytes, int tag, int* source) {
  auto* tcp = dynamic_cast<TcpCommunicator*>(&comm);
  GC_ENFORCE(tcp != nullptr, "a receive from any rank needs a TCP communicator, not ", comm.kind());
  return std::make_unique<AnySourceTransfer>(*tcp, data, bytes, tag, source);
}

std::unique_ptr<Communicator> MakeCommunicator(std::shared_ptr<Mesh> mesh, uint32_t context,
                                               std::vector<int> members, int rank) {
  return std::make_unique<TcpCommunicator>(std::move(mesh), context, std::move(members), rank);
}

Mesh* MeshOf(Communicator& comm) {
  auto* tcp = dynamic_cast<TcpCommunicator*>(&comm);
  return tcp == nullptr ? nullptr : &tcp->mesh();
}

}  // namespace tcp
}  // namespace gradcomp
