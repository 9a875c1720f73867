// Node-local communicator over an MPI-3 shared-memory window (MPI_Win_allocate_shared).
// Reductions and gathers copy through each rank's window segment and read peers' segments
// directly, and wait for each other on a barrier in the window (ShmBarrier: a waiting rank
// sleeps); point-to-point, alltoall and splits go through MPI on the same ranks.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "ops/comm/mpi_communicator.h"
#include "ops/comm/shm_barrier.h"

namespace gradcomp {

/// Collectives of ranks sharing one node's memory through a window of two staging
/// areas per rank (inputs, reduced slices), each `staging_bytes` large; larger buffers
/// go through in rounds.
class ShmCommunicator final : public Communicator {
 public:
  /// Default staging area per rank: large enough that a 64 MB bucket takes few rounds.
  static constexpr size_t kDefaultStagingBytes = size_t{16} << 20;

  /// All ranks of `node` must share memory; `node` is duplicated, not retained.
  explicit ShmCommunicator(MPI_Comm node, size_t staging_bytes = kDefaultStagingBytes);
  ~ShmCommunicator() override;
  ShmCommunicator(const ShmCommunicator&) = delete;
  ShmCommunicator& operator=(const ShmCommunicator&) = delete;

  int rank() const override { return mpi_.rank(); }
  int size() const override { return mpi_.size(); }
  const char* kind() const override { return "shm"; }
  bool nonblocking() const override { return true; }

  void Send(const void* data, size_t bytes, int peer, int tag) override { mpi_.Send(data, bytes, peer, tag); }
  void Recv(void* data, size_t bytes, int peer, int tag) override { mpi_.Recv(data, bytes, peer, tag); }
  void SendRecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes, int src,
                int tag) override {
    mpi_.SendRecv(send, send_bytes, dst, recv, recv_bytes, src, tag);
  }
  std::unique_ptr<PendingTransfer> Isend(const void* data, size_t bytes, int peer, int tag) override {
    return mpi_.Isend(data, bytes, peer, tag);
  }
  std::unique_ptr<PendingTransfer> Irecv(void* data, size_t bytes, int peer, int tag) override {
    return mpi_.Irecv(data, bytes, peer, tag);
  }
  /// In shared memory (ShmBarrier): a rank waiting for a late peer sleeps, where MPI's polls.
  void Barrier() override { barrier_->Wait(); }
  void Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) override;
  /// Without a fusion buffer: each rank stages its slices of the concatenation straight from
  /// the pieces' inputs into its window area, reduces its own slice from every rank's area,
  /// applies `finish` to it there (so each rank scales only its slice), and copies every
  /// rank's reduced slice straight to the pieces' outputs. Per rank that is one staging copy,
  /// a reduction of 1/size of the data and one copy out, where fusion + MPI_Allreduce +
  /// unfusion copy the whole buffer four times. Small buffers go to MPI (fewer barriers).
  void AllreducePieces(const std::vector<BufferPiece>& pieces, DataType dtype, ReduceOp op, double prescale,
                       const FinishFn& finish, std::vector<char>& fusion) override;
  void ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override;
  void Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override;
  void Gatherv(const void* in, void* out, const std::vector<size_t>& bytes, int root) override {
    mpi_.Gatherv(in, out, bytes, root);
  }
  void Broadcast(void* data, size_t bytes, int root) override;
  void Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes) override {
    mpi_.Alltoallv(in, send_bytes, out, recv_bytes);
  }
  std::unique_ptr<Communicator> Split(int color, int key) override { return mpi_.Split(color, key); }
  std::unique_ptr<Communicator> SplitLocal(int forced_local_size) override {
    return mpi_.SplitLocal(forced_local_size);
  }

 private:
  /// Below this many bytes a fused allreduce goes through MPI: the staged path's two barriers
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

  MpiCommunicator mpi_;
  const int rank_;  // for GC_MPI_CHECK messages
  size_t staging_bytes_;
  MPI_Win win_ = MPI_WIN_NULL;
  std::vector<char*> segments_;
  std::unique_ptr<ShmBarrier> barrier_;  // its state in rank 0's segment, after the staging areas
};

}  // namespace gradcomp
