#include "ops/comm/inprocess_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>

#include "ops/common/enforce.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

/// State shared by the thread ranks of one group: a generation barrier, a slot per rank
/// for publishing pointers, and mailboxes for point-to-point messages.
class InProcessWorld {
 public:
  explicit InProcessWorld(int size) : size_(size), slots_(static_cast<size_t>(size), nullptr) {}

  int size() const { return size_; }

  void Barrier() {
    std::unique_lock<std::mutex> lock(mu_);
    CheckAborted();
    const uint64_t gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    CheckAborted();
  }

  /// Publishes `mine` and returns every rank's pointer. The caller must Barrier() once it has
  /// finished reading through them (peers' buffers stay valid only until then).
  std::vector<const void*> Exchange(int rank, const void* mine) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      slots_[static_cast<size_t>(rank)] = mine;
    }
    Barrier();
    std::vector<const void*> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      all = slots_;
    }
    return all;
  }

  void Post(int src, int dst, int tag, const void* data, size_t bytes) {
    std::vector<char> msg(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    std::lock_guard<std::mutex> lock(mu_);
    CheckAborted();
    mailboxes_[std::make_tuple(src, dst, tag)].push_back(std::move(msg));
    cv_.notify_all();
  }

  void Take(int src, int dst, int tag, void* data, size_t bytes) {
    std::unique_lock<std::mutex> lock(mu_);
    auto key = std::make_tuple(src, dst, tag);
    cv_.wait(lock, [&] { return aborted_ || !mailboxes_[key].empty(); });
    CheckAborted();
    std::vector<char> msg = std::move(mailboxes_[key].front());
    mailboxes_[key].pop_front();
    if (msg.size() != bytes) {
      GC_THROW("inproc rank ", dst, ": message from rank ", src, " (tag ", tag, ") has ", msg.size(),
               " bytes, expected ", bytes);
    }
    if (bytes > 0) std::memcpy(data, msg.data(), bytes);
  }

  /// Take without waiting: false when no message is there yet.
  bool TryTake(int src, int dst, int tag, void* data, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      CheckAborted();
      auto it = mailboxes_.find(std::make_tuple(src, dst, tag));
      if (it == mailboxes_.end() || it->second.empty()) return false;
    }
    Take(src, dst, tag, data, bytes);  // only this rank takes from its mailboxes
    return true;
  }

  void Abort(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_) abort_reason_ = why;
    aborted_ = true;
    cv_.notify_all();
    for (auto& child : children_) {
      if (auto c = child.lock()) c->Abort(why);
    }
  }

  void AddChild(const std::shared_ptr<InProcessWorld>& child) {
    std::lock_guard<std::mutex> lock(mu_);
    children_.push_back(child);
  }

 private:
  void CheckAborted() const {
    if (aborted_) GC_THROW("in-process world aborted: ", abort_reason_);
  }

  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string abort_reason_;
  std::vector<const void*> slots_;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<char>>> mailboxes_;
  std::vector<std::weak_ptr<InProcessWorld>> children_;  // worlds made by Split, aborted with us
};

namespace {

class Finished final : public PendingTransfer {
 public:
  bool Test() override { return true; }
};

class Receive final : public PendingTransfer {
 public:
  Receive(std::shared_ptr<InProcessWorld> world, int src, int dst, int tag, void* data, size_t bytes)
      : world_(std::move(world)), src_(src), dst_(dst), tag_(tag), data_(data), bytes_(bytes) {}
  ~Receive() override {
    try {
      if (!done_) world_->Take(src_, dst_, tag_, data_, bytes_);
    } catch (const std::exception&) {
      // aborted world: nothing left to wait for
    }
  }
  bool Test() override { return done_ || (done_ = world_->TryTake(src_, dst_, tag_, data_, bytes_)); }

 private:
  std::shared_ptr<InProcessWorld> world_;
  const int src_, dst_, tag_;
  void* data_;
  const size_t bytes_;
  bool done_ = false;
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<InProcessWorld> world, int rank)
      : world_(std::move(world)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return world_->size(); }
  const char* kind() const override { return "inproc"; }
  bool nonblocking() const override { return true; }
  InProcessWorld& world() { return *world_; }

  void Send(const void* data, size_t bytes, int peer, int tag) override {
    CheckPeer(peer, "send");
    world_->Post(rank_, peer, tag, data, bytes);
  }
  void Recv(void* data, size_t bytes, int peer, int tag) override {
    CheckPeer(peer, "recv");
    world_->Take(peer, rank_, tag, data, bytes);
  }
  std::unique_ptr<PendingTransfer> Isend(const void* data, size_t bytes, int peer, int tag) override {
    Send(data, bytes, peer, tag);  // posting is buffered: done at once
    return std::make_unique<Finished>();
  }
  std::unique_ptr<PendingTransfer> Irecv(void* data, size_t bytes, int peer, int tag) override {
    CheckPeer(peer, "recv");
    return std::make_unique<Receive>(world_, peer, rank_, tag, data, bytes);
  }
  void SendRecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes, int src,
                int tag) override {
    Send(send, send_bytes, dst, tag);  // posting is buffered, so this cannot deadlock
    Recv(recv, recv_bytes, src, tag);
  }

  void Barrier() override { world_->Barrier(); }

  void Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) override {
    const size_t esize = DataTypeSize(dtype);
    const std::vector<size_t> counts = EvenSplit(count, size());
    const std::vector<size_t> offsets = Offsets(counts);
    const size_t mine = static_cast<size_t>(rank_);
    // Phase 1: each rank reduces its slice from every rank's input, in rank order.
    std::vector<char> slice(counts[mine] * esize);
    const std::vector<const void*> inputs = world_->Exchange(rank_, in);
    ReduceMany(slice.data(), inputs, offsets[mine] * esize, counts[mine], dtype, op);
    world_->Barrier();  // inputs fully read: `out` (possibly == in) may now be written
    // Phase 2: gather every rank's reduced slice.
    const std::vector<const void*> slices = world_->Exchange(rank_, slice.data());
    for (size_t r = 0; r < slices.size(); ++r) {
      if (counts[r] > 0) {
        std::memcpy(static_cast<char*>(out) + offsets[r] * esize, slices[r], counts[r] * esize);
      }
    }
    world_->Barrier();
  }

  void ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override {
    CheckVector(counts, "reducescatter counts");
    const size_t esize = DataTypeSize(dtype);
    const size_t mine = static_cast<size_t>(rank_);
    const std::vector<size_t> offsets = Offsets(counts);
    const std::vector<const void*> inputs = world_->Exchange(rank_, in);
    ReduceMany(out, inputs, offsets[mine] * esize, counts[mine], dtype, op);
    world_->Barrier();
  }

  void Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override {
    CheckVector(bytes, "allgather sizes");
    const std::vector<size_t> offsets = Offsets(bytes);
    const std::vector<const void*> inputs = world_->Exchange(rank_, in);
    for (size_t r = 0; r < inputs.size(); ++r) {
      char* dst = static_cast<char*>(out) + offsets[r];
      if (bytes[r] > 0 && dst != inputs[r]) std::memcpy(dst, inputs[r], bytes[r]);
    }
    world_->Barrier();
  }

  void Gatherv(const void* in, void* out, const std::vector<size_t>& bytes, int root) override {
    CheckVector(bytes, "gather sizes");
    CheckPeer(root, "gather root");
    const std::vector<const void*> inputs = world_->Exchange(rank_, in);
    if (rank_ == root) {
      const std::vector<size_t> offsets = Offsets(bytes);
      for (size_t r = 0; r < inputs.size(); ++r) {
        if (bytes[r] > 0) std::memcpy(static_cast<char*>(out) + offsets[r], inputs[r], bytes[r]);
      }
    }
    world_->Barrier();
  }

  void Broadcast(void* data, size_t bytes, int root) override {
    CheckPeer(root, "broadcast root");
    const std::vector<const void*> ptrs = world_->Exchange(rank_, data);
    if (rank_ != root && bytes > 0) std::memcpy(data, ptrs[static_cast<size_t>(root)], bytes);
    world_->Barrier();
  }

  void Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes) override {
    CheckVector(send_bytes, "alltoall send sizes");
    CheckVector(recv_bytes, "alltoall receive sizes");
    struct Published {
      const char* data;
      const std::vector<size_t>* send_bytes;
    } mine{static_cast<const char*>(in), &send_bytes};
    const std::vector<const void*> all = world_->Exchange(rank_, &mine);
    const std::vector<size_t> recv_offsets = Offsets(recv_bytes);
    const size_t me = static_cast<size_t>(rank_);
    // Peers read this rank's buffers until the final barrier: never leave before it, even on
    // an error (report it after).
    std::string error;
    for (size_t r = 0; r < all.size() && error.empty(); ++r) {
      const auto* peer = static_cast<const Published*>(all[r]);
      const size_t offset = Offsets(*peer->send_bytes)[me];
      const size_t n = (*peer->send_bytes)[me];
      if (n != recv_bytes[r]) {
        error = detail::StrCat("alltoall: rank ", rank_, " expects ", recv_bytes[r], " bytes from rank ", r,
                               " but rank ", r, " sends ", n);
        break;
      }
      if (n > 0) std::memcpy(static_cast<char*>(out) + recv_offsets[r], peer->data + offset, n);
    }
    world_->Barrier();
    if (!error.empty()) throw Error(error);
  }

  std::unique_ptr<Communicator> Split(int color, int key) override {
    struct Published {
      int color, key;
      std::shared_ptr<InProcessWorld> created;
    } mine{color, key, nullptr};
    const std::vector<const void*> all = world_->Exchange(rank_, &mine);
    std::vector<std::pair<std::pair<int, int>, int>> members;  // ((key, rank), rank)
    for (size_t r = 0; r < all.size(); ++r) {
      const auto* p = static_cast<const Published*>(all[r]);
      if (color >= 0 && p->color == color) members.push_back({{p->key, static_cast<int>(r)}, static_cast<int>(r)});
    }
    std::sort(members.begin(), members.end());
    int new_rank = -1;
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].second == rank_) new_rank = static_cast<int>(i);
    }
    if (new_rank == 0) {
      mine.created = std::make_shared<InProcessWorld>(static_cast<int>(members.size()));
      world_->AddChild(mine.created);
    }
    world_->Barrier();  // leaders have created their groups' worlds
    std::shared_ptr<InProcessWorld> group;
    if (color >= 0) group = static_cast<const Published*>(all[static_cast<size_t>(members[0].second)])->created;
    world_->Barrier();  // every rank holds its own reference before `mine` goes away
    if (color < 0) return nullptr;
    return std::make_unique<InProcessCommunicator>(std::move(group), new_rank);
  }

  std::unique_ptr<Communicator> SplitLocal(int forced_local_size) override {
    // Threads always share memory: without a forced size the whole world is one node.
    if (forced_local_size <= 0) return Split(0, rank_);
    if (size() % forced_local_size != 0) {
      GC_THROW("GRADCOMP_LOCAL_SIZE=", forced_local_size, " does not divide the world size ", size());
    }
    return Split(rank_ / forced_local_size, rank_);
  }

 private:
  void CheckPeer(int peer, const char* what) const {
    if (peer < 0 || peer >= size()) {
      GC_THROW("inproc rank ", rank_, ": ", what, " peer ", peer, " is outside 0..", size() - 1);
    }
  }
  void CheckVector(const std::vector<size_t>& v, const char* what) const {
    if (v.size() != static_cast<size_t>(size())) {
      GC_THROW("inproc rank ", rank_, ": ", what, " has ", v.size(), " entries for ", size(), " ranks");
    }
  }

  std::shared_ptr<InProcessWorld> world_;
  const int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> CreateInProcessWorld(int size) {
  GC_ENFORCE(size >= 1, "an in-process world needs at least one rank, got ", size);
  auto world = std::make_shared<InProcessWorld>(size);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(std::make_unique<InProcessCommunicator>(world, r));
  return comms;
}

void AbortInProcessWorld(Communicator& comm, const std::string& why) {
  auto* inproc = dynamic_cast<InProcessCommunicator*>(&comm);
  GC_ENFORCE(inproc != nullptr, "AbortInProcessWorld needs an in-process communicator, got ", comm.kind());
  inproc->world().Abort(why);
}

}  // namespace gradcomp
