// The bootstrap of a world without MPI: a communicator whose few collectives go through a store
// (ops/comm/store.h), enough to connect the TCP mesh (ops/comm/tcp_communicator.h), which is then
// the world: every collective, the negotiation and the node's shared memory run on it as they do
// on MPI's world. What Horovod does with `horovodrun --gloo` (a rendezvous server, then gloo's
// pairs) and torch with env:// (a TCPStore, then gloo or NCCL), so that torchrun, Kubernetes'
// PyTorchJob and srun start gradcomp without an MPI launcher.
#pragma once

#include <memory>
#include <string>

#include "ops/comm/communicator.h"
#include "ops/comm/store.h"
#include "ops/comm/tcp_communicator.h"

namespace gradcomp {

/// Collectives over a store: each operation of a rank writes one key
/// ("<prefix>/<n>/<rank>", n counting the communicator's operations) and reads the others'.
/// Slow (a round trip to the store per key) and meant only for a world's first exchanges;
/// Split and SplitLocal are refused. A peer that does not write its key within the timeout
/// fails the operation naming it.
class StoreCommunicator final : public Communicator {
 public:
  StoreCommunicator(Store& store, std::string prefix, int rank, int size, double timeout_seconds);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "store"; }

  void Send(const void* data, size_t bytes, int peer, int tag) override;
  void Recv(void* data, size_t bytes, int peer, int tag) override;
  void SendRecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes, int src,
                int tag) override;
  void Barrier() override;
  void Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) override;
  void ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override;
  void Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override;
  void Gatherv(const void* in, void* out, const std::vector<size_t>& bytes, int root) override;
  void Broadcast(void* data, size_t bytes, int root) override;
  void Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes) override;
  std::unique_ptr<Communicator> Split(int color, int key) override;
  std::unique_ptr<Communicator> SplitLocal(int forced_local_size) override;

 private:
  /// The value rank `peer` set under `key`, exactly `bytes` long; throws naming the peer when it
  /// does not come within the timeout.
  std::string Await(const std::string& key, int peer, size_t bytes, const char* what);
  std::string Key(uint64_t op, int from, int to = -1) const;

  Store& store_;
  const std::string prefix_;
  const int rank_, size_;
  const double timeout_seconds_;
  uint64_t ops_ = 0;           // collective operations so far (the same on every rank)
  std::vector<uint64_t> sent_;      // messages sent to each peer
  std::vector<uint64_t> received_;  // messages received from each peer
};

/// Collective over the `size` ranks that reach `store` (each passing its `rank` and the same
/// `prefix`, fresh for each world): connects the TCP mesh through the store and returns its
/// communicator, the world. Throws gradcomp::Error on every rank, naming the ranks that did not
/// come within `timeout_seconds` or could not be connected.
std::unique_ptr<Communicator> ConnectStoreWorld(Store& store, const std::string& prefix, int rank, int size,
                                                double timeout_seconds, const TcpOptions& options,
                                                TcpReport* report = nullptr);

}  // namespace gradcomp
