// Node-local communicator over memory the node's ranks share: an MPI-3 shared-memory window
// (MPI_Win_allocate_shared, shm_mpi_window.h) in an MPI world, a POSIX shared-memory object
// (shm_posix_window.h) in a TCP one. Reductions and gathers copy through each rank's segment
// and read peers' segments directly, and wait for each other on a barrier in the shared memory
// (ShmBarrier: a waiting rank sleeps); point-to-point, alltoall and splits go through the
// node's message communicator (MPI's or the TCP mesh's) on the same ranks.
#pragma once

#include <memory>
#include <vector>

#include "ops/comm/communicator.h"
#include "ops/comm/shm_barrier.h"

namespace gradcomp {

/// Memory that every rank of a node maps: one segment per rank, each at least the bytes asked.
class SharedSegments {
 public:
  virtual ~SharedSegments() = default;
  /// Rank r's segment, at its address in this process.
  virtual char* segment(int r) const = 0;
  /// Orders this rank's writes to the segments before its later reads of peers' writes (with
  /// the barrier's atomics): MPI_Win_sync for an MPI window, a fence for plain shared memory.
  virtual void Fence() = 0;
};

/// Collectives of ranks sharing one node's memory through a window of two staging
/// areas per rank (inputs, reduced slices), each `staging_bytes` large; larger buffers
/// go through in rounds.
class ShmCommunicator final : public Communicator {
 public:
  /// Default staging area per rank: large enough that a 64 MB bucket takes few rounds.
  static constexpr size_t kDefaultStagingBytes = size_t{16} << 20;

  /// Bytes of a rank's segment for `staging_bytes` of staging (the two areas and the barrier).
  static size_t SegmentBytes(size_t staging_bytes) { return 2 * staging_bytes + 2 * ShmBarrier::kBytes; }

  /// Collective over `messages` (the node's ranks, which share `segments`, each of at least
  /// SegmentBytes(staging_bytes)); both are kept, the segments released first.
  ShmCommunicator(std::unique_ptr<Communicator> messages, std::unique_ptr<SharedSegments> segments,
                  size_t staging_bytes = kDefaultStagingBytes);
  ~ShmCommunicator() override;
  ShmCommunicator(const ShmCommunicator&) = delete;
  ShmCommunicator& operator=(const ShmCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return messages_->size(); }
  const char* kind() const override { return "shm"; }
  bool nonblocking() const override { return messages_->nonblocking(); }
  void WaitForProgress(double seconds, int wake_fd) override { messages_->WaitForProgress(seconds, wake_fd); }
  bool wakes_waiters() const override { return messages_->wakes_waiters(); }

  void Send(const void* data, size_t bytes, int peer, int tag) override { messages_->Send(data, bytes, peer, tag); }
  void Recv(void* data, size_t bytes, int peer, int tag) override { messages_->Recv(data, bytes, peer, tag); }
  void SendRecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes, int src,
                int tag) override {
    messages_->SendRecv(send, send_bytes, dst, recv, recv_bytes, src, tag);
  }
  std::unique_ptr<PendingTransfer> Isend(const void* data, size_t bytes, int peer, int tag) override {
    return messages_->Isend(data, bytes, peer, tag);
  }
  std::unique_ptr<PendingTransfer> Irecv(void* data, size_t bytes, int peer, int tag) override {
    return messages_->Irecv(data, bytes, peer, tag);
  }
  /// In shared memory (ShmBarrier): a rank waiting for a late peer sleeps, where MPI's polls.
  void Barrier() override { barrier_->Wait(); }
  void Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) override;
  /// Without a fusion buffer: each rank stages its slices of the concatenation straight from
  /// the pieces' inputs into its window area, reduces its own slice from every rank's area,
  /// applies `finish` to it there (so each rank scales only its slice), and copies every
  /// rank's reduced slice straight to the pieces' outputs. Per rank that is one staging copy,
  /// a reduction of 1/size of the data and one copy out, where fusion + MPI_Allreduce +
  /// unfusion copy the whole buffer four times. Small buffers go to the messages (fewer barriers).
  void AllreducePieces(const std::vector<BufferPiece>& pieces, DataType dtype, ReduceOp op, double prescale,
                       const FinishFn& finish, std::vector<char>& fusion) override;
  void ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override;
  void Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override;
  void Gatherv(const void* in, void* out, const std::vector<size_t>& bytes, int root) override {
    messages_->Gatherv(in, out, bytes, root);
  }
  void Broadcast(void* data, size_t bytes, int root) override;
  void Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes) override {
    messages_->Alltoallv(in, send_bytes, out, recv_bytes);
  }
  std::unique_ptr<Communicator> Split(int color, int key) override { return messages_->Split(color, key); }
  std::unique_ptr<Communicator> SplitLocal(int forced_local_size) override {
    return messages_->SplitLocal(forced_local_size);
  }

 private:
  /// Below this many bytes a fused allreduce goes through the messages: the staged path's two barriers
  /// cost more than the copies they save.
  static constexpr size_t kMinStagedBytes = size_t{2} << 10;
  /// Elements reduced, finished and copied out together (stays in the L1/L2 cache).
  static constexpr size_t kBlockElements = 4096;
  /// The staged allreduce of AllreducePieces, in rounds of the staging area.
  void StagedAllreduce(const std::vector<BufferPiece>& pieces, DataType dtype, ReduceOp op, double prescale,
                       const FinishFn& finish);
  /// Makes every rank's writes to its segment visible to all, and waits for all ranks (in
  /// shared memory: a rank waiting for a late peer sleeps, where MPI_Barrier polls).
  void Sync();
  char* Stage(int r) const { return segments_[static_cast<size_t>(r)]; }
  char* Result(int r) const { return segments_[static_cast<size_t>(r)] + staging_bytes_; }
  /// Reduce-scatter of one round: slab `round` of each rank's slices, my reduced slab into `dst`.
  void ReduceRound(const char* in, const std::vector<size_t>& counts, const std::vector<size_t>& offsets,
                   size_t slab, size_t round, DataType dtype, ReduceOp op, char* dst);

  std::unique_ptr<Communicator> messages_;
  std::unique_ptr<SharedSegments> shared_;  // released before messages_ (an MPI window is freed on its comm)
  const int rank_;
  size_t staging_bytes_;
  std::vector<char*> segments_;
  std::unique_ptr<ShmBarrier> barrier_;  // its state in rank 0's segment, after the staging areas
};

}  // namespace gradcomp
