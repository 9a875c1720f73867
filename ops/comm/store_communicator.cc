#include "ops/comm/store_communicator.h"

#include <cstring>
#include <utility>

#include "ops/common/enforce.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

StoreCommunicator::StoreCommunicator(Store& store, std::string prefix, int rank, int size, double timeout_seconds)
    : store_(store), prefix_(std::move(prefix)), rank_(rank), size_(size), timeout_seconds_(timeout_seconds),
      sent_(static_cast<size_t>(size)), received_(static_cast<size_t>(size)) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw InvalidArgument("a world of " + std::to_string(size) + " ranks has no rank " + std::to_string(rank) +
                          " (RANK and WORLD_SIZE)");
  }
}

std::string StoreCommunicator::Key(uint64_t op, int from, int to) const {
  std::string key = prefix_ + "/" + std::to_string(op) + "/" + std::to_string(from);
  if (to >= 0) key += "/" + std::to_string(to);
  return key;
}

std::string StoreCommunicator::Await(const std::string& key, int peer, size_t bytes, const char* what) {
  std::optional<std::string> value = store_.Get(key, timeout_seconds_);
  if (!value) {
    throw Error("rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " waited " +
                std::to_string(static_cast<int>(timeout_seconds_)) + " s for rank " + std::to_string(peer) +
                " to join the world (" + what + ", store key '" + key + "'): has every rank started, and with the "
                "same WORLD_SIZE, MASTER_ADDR and MASTER_PORT?");
  }
  if (value->size() != bytes) {
    throw Error("rank " + std::to_string(rank_) + ": rank " + std::to_string(peer) + " gave " +
                std::to_string(value->size()) + " bytes for " + what + " where " + std::to_string(bytes) +
                " were expected (store key '" + key + "'): two jobs share one store prefix?");
  }
  return std::move(*value);
}

void StoreCommunicator::Send(const void* data, size_t bytes, int peer, int tag) {
  GC_ENFORCE(peer >= 0 && peer < size_, "store communicator: no rank ", peer);
  const uint64_t n = sent_[static_cast<size_t>(peer)]++;
  store_.Set(prefix_ + "/p2p/" + std::to_string(rank_) + "/" + std::to_string(peer) + "/" + std::to_string(tag) +
                 "/" + std::to_string(n),
             std::string(static_cast<const char*>(data), bytes));
}

void StoreCommunicator::Recv(void* data, size_t bytes, int peer, int tag) {
  GC_ENFORCE(peer >= 0 && peer < size_, "store communicator: no rank ", peer);
  const uint64_t n = received_[static_cast<size_t>(peer)]++;
  const std::string value = Await(prefix_ + "/p2p/" + std::to_string(peer) + "/" + std::to_string(rank_) + "/" +
                                      std::to_string(tag) + "/" + std::to_string(n),
                                  peer, bytes, "a message");
  if (bytes > 0) std::memcpy(data, value.data(), bytes);
}

void StoreCommunicator::SendRecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes,
                                 int src, int tag) {
  Send(send, send_bytes, dst, tag);  // a store's set never waits for the reader
  Recv(recv, recv_bytes, src, tag);
}

void StoreCommunicator::Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) {
  GC_ENFORCE(bytes.size() == static_cast<size_t>(size_), "store Allgatherv: sizes for ", bytes.size(),
             " ranks in a world of ", size_);
  const uint64_t op = ops_++;
  const size_t me = static_cast<size_t>(rank_);
  store_.Set(Key(op, rank_), std::string(static_cast<const char*>(in), bytes[me]));
  char* dst = static_cast<char*>(out);
  for (int r = 0; r < size_; ++r) {
    const size_t len = bytes[static_cast<size_t>(r)];
    if (r == rank_) {
      if (len > 0) std::memmove(dst, in, len);
    } else {
      const std::string value = Await(Key(op, r), r, len, "the world's first exchanges");
      if (len > 0) std::memcpy(dst, value.data(), len);
    }
    dst += len;
  }
}

void StoreCommunicator::Barrier() { Allgatherv(nullptr, nullptr, std::vector<size_t>(static_cast<size_t>(size_))); }

void StoreCommunicator::Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) {
  const size_t bytes = count * DataTypeSize(dtype);
  std::vector<char> all(bytes * static_cast<size_t>(size_));
  Allgatherv(in, all.data(), std::vector<size_t>(static_cast<size_t>(size_), bytes));
  // In rank order: every rank gets the same bits.
  for (int r = 1; r < size_; ++r) ReduceInto(all.data(), all.data() + static_cast<size_t>(r) * bytes, count, dtype, op);
  if (bytes > 0) std::memcpy(out, all.data(), bytes);
}

void StoreCommunicator::ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                                      ReduceOp op) {
  GC_ENFORCE(counts.size() == static_cast<size_t>(size_), "store ReduceScatter: counts for ", counts.size(),
             " ranks in a world of ", size_);
  const std::vector<size_t> offsets = Offsets(counts);
  const size_t total = offsets.back() + counts.back(), esize = DataTypeSize(dtype);
  std::vector<char> reduced(total * esize);
  Allreduce(in, reduced.data(), total, dtype, op);
  const size_t me = static_cast<size_t>(rank_);
  if (counts[me] > 0) std::memcpy(out, reduced.data() + offsets[me] * esize, counts[me] * esize);
}

void StoreCommunicator::Gatherv(const void* in, void* out, const std::vector<size_t>& bytes, int root) {
  GC_ENFORCE(root >= 0 && root < size_, "store Gatherv: root ", root, " outside 0..", size_ - 1);
  const std::vector<size_t> offsets = Offsets(bytes);
  std::vector<char> all(offsets.back() + bytes.back());
  Allgatherv(in, all.data(), bytes);
  if (rank_ == root && !all.empty()) std::memcpy(out, all.data(), all.size());
}

void StoreCommunicator::Broadcast(void* data, size_t bytes, int root) {
  GC_ENFORCE(root >= 0 && root < size_, "store Broadcast: root ", root, " outside 0..", size_ - 1);
  const uint64_t op = ops_++;
  if (rank_ == root) {
    store_.Set(Key(op, root), std::string(static_cast<const char*>(data), bytes));
    return;
  }
  const std::string value = Await(Key(op, root), root, bytes, "the world's first exchanges");
  if (bytes > 0) std::memcpy(data, value.data(), bytes);
}

void StoreCommunicator::Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                                  const std::vector<size_t>& recv_bytes) {
  GC_ENFORCE(send_bytes.size() == static_cast<size_t>(size_) && recv_bytes.size() == static_cast<size_t>(size_),
             "store Alltoallv: sizes for ", send_bytes.size(), " and ", recv_bytes.size(), " ranks in a world of ",
             size_);
  const uint64_t op = ops_++;
  const std::vector<size_t> soff = Offsets(send_bytes), roff = Offsets(recv_bytes);
  const char* src = static_cast<const char*>(in);
  for (int r = 0; r < size_; ++r) {
    const size_t i = static_cast<size_t>(r);
    if (r != rank_) store_.Set(Key(op, rank_, r), std::string(src + soff[i], send_bytes[i]));
  }
  char* dst = static_cast<char*>(out);
  for (int r = 0; r < size_; ++r) {
    const size_t i = static_cast<size_t>(r);
    if (r == rank_) {
      if (recv_bytes[i] > 0) std::memcpy(dst + roff[i], src + soff[i], recv_bytes[i]);
      continue;
    }
    const std::string value = Await(Key(op, r, rank_), r, recv_bytes[i], "the world's first exchanges");
    if (recv_bytes[i] > 0) std::memcpy(dst + roff[i], value.data(), recv_bytes[i]);
  }
}

std::unique_ptr<Communicator> StoreCommunicator::Split(int, int) {
  throw InvalidArgument("the store communicator only bootstraps a world: split the world it connects");
}

std::unique_ptr<Communicator> StoreCommunicator::SplitLocal(int) {
  throw InvalidArgument("the store communicator only bootstraps a world: split the world it connects");
}

std::unique_ptr<Communicator> ConnectStoreWorld(Store& store, const std::string& prefix, int rank, int size,
                                                double timeout_seconds, const TcpOptions& options,
                                                TcpReport* report) {
  StoreCommunicator bootstrap(store, prefix, rank, size, timeout_seconds);
  return ConnectTcpWorld(bootstrap, options, report);
}

}  // namespace gradcomp
