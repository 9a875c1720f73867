// Communicator over MPI (a backend file: only the MPI and shared-memory backends,
// mpi_environment.cc, mpi_point_to_point.cc and topology.cc, which picks the node's transport,
// include mpi.h). Works on a duplicate of the communicator it is given, with MPI_ERRORS_RETURN
// so every failure becomes an exception.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "ops/comm/communicator.h"
#include "ops/common/enforce.h"

namespace gradcomp {

/// MPI's own error string for an error code (empty when MPI cannot say).
std::string MpiErrorText(int code);
/// Message for a failed MPI call: the rank, the operation and MPI's own error string.
std::string MpiErrorMessage(int code, const char* operation, int rank);

/// Checks the return code of an MPI call; on failure throws gradcomp::Error naming the
/// rank (`rank_` of the enclosing object), the operation and MPI's error string.
#define GC_MPI_CHECK(call)                                                        \
  do {                                                                            \
    const int gc_mpi_rc = (call);                                                 \
    if (gc_mpi_rc != MPI_SUCCESS) {                                               \
      throw ::gradcomp::Error(::gradcomp::MpiErrorMessage(gc_mpi_rc, #call, rank_)); \
    }                                                                             \
  } while (0)

/// MPI datatype carrying one element of `dtype` (16-bit floats travel as a 2-byte type).
MPI_Datatype MpiDataType(DataType dtype);

/// Communicator over a duplicate of an MPI communicator.
class MpiCommunicator final : public Communicator {
 public:
  /// Duplicates `comm` (the original is not used afterwards) and installs MPI_ERRORS_RETURN.
  /// With `device_memory`, a CUDA-aware MPI is handed that device's buffers.
  explicit MpiCommunicator(MPI_Comm comm, Device* device_memory = nullptr);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "mpi"; }
  bool nonblocking() const override { return true; }
  Device* device_memory() const override { return device_memory_; }
  bool reduces(DataType dtype) const override {
    return device_memory_ == nullptr || (dtype != DataType::kFloat16 && dtype != DataType::kBFloat16);
  }
  /// The duplicated MPI communicator this object owns.
  MPI_Comm handle() const { return comm_; }

  void Send(const void* data, size_t bytes, int peer, int tag) override;
  void Recv(void* data, size_t bytes, int peer, int tag) override;
  void SendRecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes, int src,
                int tag) override;
  std::unique_ptr<PendingTransfer> Isend(const void* data, size_t bytes, int peer, int tag) override;
  std::unique_ptr<PendingTransfer> Irecv(void* data, size_t bytes, int peer, int tag) override;
  void Barrier() override;
  void Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) override;
  std::unique_ptr<PendingTransfer> Iallreduce(const void* in, void* out, size_t count, DataType dtype,
                                              ReduceOp op) override;
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
  MPI_Op OpFor(DataType dtype, ReduceOp op) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  Device* device_memory_ = nullptr;
  int rank_ = -1;
  int size_ = 0;
  // User-defined reductions for float16 / bfloat16 (MPI has none): [dtype][op].
  MPI_Op half_ops_[2][4];
};

}  // namespace gradcomp
