#include "test/support/device_comm.h"

#include <atomic>
#include <numeric>
#include <string>
#include <vector>

namespace gradcomp::testing {

namespace {

std::atomic<size_t> moved{0};

size_t Sum(const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t{0}); }

class DeviceMemory final : public Communicator {
 public:
  DeviceMemory(Communicator& inner, std::unique_ptr<Communicator> owned, Device& device, bool nonblocking)
      : owned_(std::move(owned)),
        inner_(inner),
        device_(device),
        stream_(device.NewStream()),
        nonblocking_(nonblocking) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* kind() const override { return "device-memory (tests)"; }
  Device* device_memory() const override { return &device_; }
  // CUDA-aware MPI's point-to-point transfers, or none, as NCCL's (Isend and Irecv throw, as
  // the base class's do): the collectives must then take the transport's own.
  bool nonblocking() const override { return nonblocking_; }

  void Send(const void* data, size_t bytes, int peer, int tag) override {
    inner_.Send(In(data, bytes).data(), bytes, peer, tag);
  }
  void Recv(void* data, size_t bytes, int peer, int tag) override {
    std::vector<char> tmp(bytes);
    inner_.Recv(tmp.data(), bytes, peer, tag);
    Out(data, tmp);
  }
  void SendRecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes, int src,
                int tag) override {
    std::vector<char> tmp(recv_bytes);
    inner_.SendRecv(In(send, send_bytes).data(), send_bytes, dst, tmp.data(), recv_bytes, src, tag);
    Out(recv, tmp);
  }
  std::unique_ptr<PendingTransfer> Isend(const void* data, size_t bytes, int peer, int tag) override {
    if (!nonblocking_) return Communicator::Isend(data, bytes, peer, tag);
    auto t = std::make_unique<Staged>(*this, nullptr, In(data, bytes));
    t->inner = inner_.Isend(t->host.data(), bytes, peer, tag);
    return t;
  }
  std::unique_ptr<PendingTransfer> Irecv(void* data, size_t bytes, int peer, int tag) override {
    if (!nonblocking_) return Communicator::Irecv(data, bytes, peer, tag);
    auto t = std::make_unique<Staged>(*this, data, std::vector<char>(bytes));
    t->inner = inner_.Irecv(t->host.data(), bytes, peer, tag);
    return t;
  }
  void Barrier() override { inner_.Barrier(); }
  void Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) override {
    std::vector<char> tmp = In(in, count * DataTypeSize(dtype));
    inner_.Allreduce(tmp.data(), tmp.data(), count, dtype, op);
    Out(out, tmp);
  }
  void AllreducePieces(const std::vector<BufferPiece>& pieces, DataType dtype, ReduceOp op, double prescale,
                       const FinishFn& finish, std::vector<char>& fusion) override {
    std::vector<std::vector<char>> tmp(pieces.size());
    std::vector<BufferPiece> host = pieces;
    for (size_t i = 0; i < pieces.size(); ++i) {
      tmp[i] = pieces[i].input ? In(pieces[i].input, pieces[i].count * DataTypeSize(dtype))
                               : std::vector<char>(pieces[i].count * DataTypeSize(dtype));
      host[i].input = pieces[i].input ? tmp[i].data() : nullptr;
      host[i].output = pieces[i].output ? tmp[i].data() : nullptr;
    }
    inner_.AllreducePieces(host, dtype, op, prescale, finish, fusion);
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (pieces[i].output) Out(pieces[i].output, tmp[i]);
    }
  }
  void ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override {
    const size_t esize = DataTypeSize(dtype);
    std::vector<char> tmp(counts[static_cast<size_t>(rank())] * esize);
    inner_.ReduceScatter(In(in, Sum(counts) * esize).data(), tmp.data(), counts, dtype, op);
    Out(out, tmp);
  }
  void Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override {
    std::vector<char> tmp(Sum(bytes));
    inner_.Allgatherv(In(in, bytes[static_cast<size_t>(rank())]).data(), tmp.data(), bytes);
    Out(out, tmp);
  }
  void Gatherv(const void* in, void* out, const std::vector<size_t>& bytes, int root) override {
    std::vector<char> tmp(Sum(bytes));
    inner_.Gatherv(In(in, bytes[static_cast<size_t>(rank())]).data(), tmp.data(), bytes, root);
    if (rank() == root) Out(out, tmp);
  }
  void Broadcast(void* data, size_t bytes, int root) override {
    std::vector<char> tmp = In(data, bytes);
    inner_.Broadcast(tmp.data(), bytes, root);
    Out(data, tmp);
  }
  void Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes) override {
    std::vector<char> tmp(Sum(recv_bytes));
    inner_.Alltoallv(In(in, Sum(send_bytes)).data(), send_bytes, tmp.data(), recv_bytes);
    Out(out, tmp);
  }
  std::unique_ptr<Communicator> Split(int color, int key) override { return Wrap(inner_.Split(color, key)); }
  std::unique_ptr<Communicator> SplitLocal(int forced_local_size) override {
    return Wrap(inner_.SplitLocal(forced_local_size));
  }

 private:
  // An Isend / Irecv through a host copy; a receive lands on the device once complete.
  struct Staged final : PendingTransfer {
    Staged(DeviceMemory& c, void* d, std::vector<char> h) : comm(c), dst(d), host(std::move(h)) {}
    bool Test() override {
      if (done) return true;
      if (!inner->Test()) return false;
      if (dst != nullptr) comm.Out(dst, host);
      done = true;
      return true;
    }
    DeviceMemory& comm;
    void* dst;
    std::vector<char> host;
    std::unique_ptr<PendingTransfer> inner;
    bool done = false;
  };

  std::unique_ptr<Communicator> Wrap(std::unique_ptr<Communicator> c) {
    if (!c) return nullptr;
    Communicator& ref = *c;
    return std::make_unique<DeviceMemory>(ref, std::move(c), device_, nonblocking_);
  }
  // The device bytes at `data`, on the host.
  std::vector<char> In(const void* data, size_t bytes) {
    moved += bytes;
    std::vector<char> tmp(bytes);
    device_.CopyToHost(tmp.data(), data, bytes, *stream_);
    stream_->Synchronize();
    return tmp;
  }
  void Out(void* data, const std::vector<char>& tmp) {
    device_.CopyFromHost(data, tmp.data(), tmp.size(), *stream_);
    stream_->Synchronize();
  }

  std::unique_ptr<Communicator> owned_;
  Communicator& inner_;
  Device& device_;
  std::unique_ptr<Stream> stream_;
  const bool nonblocking_;
};

}  // namespace

size_t DeviceMemoryCommunicatorBytes() { return moved.load(); }

std::unique_ptr<Communicator> DeviceMemoryCommunicator(Communicator& inner, Device& device, bool nonblocking) {
  return std::make_unique<DeviceMemory>(inner, nullptr, device, nonblocking);
}

}  // namespace gradcomp::testing
