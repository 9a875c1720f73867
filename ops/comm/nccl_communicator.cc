// NCCL implementation of the Communicator interface (see nccl_communicator.h).
#include "ops/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "ops/common/enforce.h"
#include "ops/device/cuda_device.h"

namespace gradcomp {
namespace {

// Throws gradcomp::Error naming this rank (`rank_` in scope), the call and the library's message.
#define GC_GPU_CHECK(call, success, describe)                                                          \
  do {                                                                                                 \
    const auto gc_rc = (call);                                                                         \
    if (gc_rc != (success)) {                                                                          \
      throw ::gradcomp::Error("rank " + std::to_string(rank_) + ": " #call " failed: " + describe(gc_rc)); \
    }                                                                                                  \
  } while (0)
#define GC_NCCL_CHECK(call) GC_GPU_CHECK(call, ncclSuccess, ncclGetErrorString)
#define GC_CUDA_CHECK(call) GC_GPU_CHECK(call, cudaSuccess, cudaGetErrorString)

ncclDataType_t NcclType(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return ncclUint8;
    case DataType::kInt8: return ncclInt8;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kBool: return ncclUint8;
    case DataType::kInt16: break;  // NCCL has no 16-bit integer type
  }
  throw InvalidArgument(std::string("NCCL communicator: dtype ") + DataTypeName(dtype) + " is not supported");
}

ncclRedOp_t NcclOp(ReduceOp op, DataType dtype) {
  if (dtype == DataType::kBool && (op == ReduceOp::kSum || op == ReduceOp::kProduct)) {
    throw InvalidArgument("NCCL communicator: bool tensors reduce with min or max only");
  }
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
    default: break;
  }
  throw InvalidArgument(std::string("NCCL communicator: unsupported reduce op ") + ReduceOpName(op));
}

const char* Bytes(const void* p, size_t offset) { return static_cast<const char*>(p) + offset; }
char* Bytes(void* p, size_t offset) { return static_cast<char*>(p) + offset; }

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int device) : comm_(comm), device_(device) {
    int rank = 0, size = 0;
    GC_NCCL_CHECK(ncclCommUserRank(comm_, &rank));
    rank_ = rank;
    GC_NCCL_CHECK(ncclCommCount(comm_, &size));
    size_ = size;
    GC_CUDA_CHECK(cudaSetDevice(device_));
    GC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    GC_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(int32_t)));
  }
  ~NcclCommunicator() override {
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
    ncclCommDestroy(comm_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "nccl"; }
  // Every buffer is in the GPU's memory: the compressed collectives keep their wire buffers there.
  Device* device_memory() const override { return &CudaDevice(device_); }
  bool reduces(DataType dtype) const override { return dtype != DataType::kInt16; }  // NCCL has no int16

  void Send(const void* data, size_t bytes, int peer, int /*tag*/) override {
    GC_NCCL_CHECK(ncclSend(data, bytes, ncclUint8, peer, comm_, stream_));
    Wait();
  }
  void Recv(void* data, size_t bytes, int peer, int /*tag*/) override {
    GC_NCCL_CHECK(ncclRecv(data, bytes, ncclUint8, peer, comm_, stream_));
    Wait();
  }
  void SendRecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes, int src,
                int /*tag*/) override {
    GC_NCCL_CHECK(ncclGroupStart());
    GC_NCCL_CHECK(ncclSend(send, send_bytes, ncclUint8, dst, comm_, stream_));
    GC_NCCL_CHECK(ncclRecv(recv, recv_bytes, ncclUint8, src, comm_, stream_));
    GC_NCCL_CHECK(ncclGroupEnd());
    Wait();
  }
  void Barrier() override {
    GC_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_));
    Wait();
  }
  void Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) override {
    GC_NCCL_CHECK(ncclAllReduce(in, out, count, NcclType(dtype), NcclOp(op, dtype), comm_, stream_));
    Wait();
  }
  void ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DataType dtype,
                     ReduceOp op) override {
    CheckParts(counts.size(), "reduce-scatter");
    const size_t esize = DataTypeSize(dtype);
    bool even = true;
    for (size_t c : counts) even = even && c == counts[0];
    if (even) {
      GC_NCCL_CHECK(ncclReduceScatter(in, out, counts[0], NcclType(dtype), NcclOp(op, dtype), comm_, stream_));
    } else {  // uneven slices: one reduce per owner, grouped
      const std::vector<size_t> offsets = Offsets(counts);
      GC_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < size_; ++r) {
        GC_NCCL_CHECK(ncclReduce(Bytes(in, offsets[r] * esize), out, counts[r], NcclType(dtype), NcclOp(op, dtype),
                                 r, comm_, stream_));
      }
      GC_NCCL_CHECK(ncclGroupEnd());
    }
    Wait();
  }
  void Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override {
    CheckParts(bytes.size(), "allgather");
    bool even = true;
    for (size_t b : bytes) even = even && b == bytes[0];
    if (even) {
      GC_NCCL_CHECK(ncclAllGather(in, out, bytes[0], ncclUint8, comm_, stream_));
    } else {  // uneven parts: one broadcast per rank, grouped
      const std::vector<size_t> offsets = Offsets(bytes);
      GC_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < size_; ++r) {
        GC_NCCL_CHECK(ncclBroadcast(in, Bytes(out, offsets[r]), bytes[r], ncclUint8, r, comm_, stream_));
      }
      GC_NCCL_CHECK(ncclGroupEnd());
    }
    Wait();
  }
  void Gatherv(const void* in, void* out, const std::vector<size_t>& bytes, int root) override {
    CheckParts(bytes.size(), "gather");
    const std::vector<size_t> offsets = Offsets(bytes);
    GC_NCCL_CHECK(ncclGroupStart());
    if (rank_ == root) {
      for (int r = 0; r < size_; ++r) {
        if (r != root) GC_NCCL_CHECK(ncclRecv(Bytes(out, offsets[r]), bytes[r], ncclUint8, r, comm_, stream_));
      }
    } else {
      GC_NCCL_CHECK(ncclSend(in, bytes[rank_], ncclUint8, root, comm_, stream_));
    }
    GC_NCCL_CHECK(ncclGroupEnd());
    if (rank_ == root && bytes[root] > 0) {
      GC_CUDA_CHECK(cudaMemcpyAsync(Bytes(out, offsets[root]), in, bytes[root], cudaMemcpyDeviceToDevice, stream_));
    }
    Wait();
  }
  void Broadcast(void* data, size_t bytes, int root) override {
    GC_NCCL_CHECK(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_));
    Wait();
  }
  void Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                 const std::vector<size_t>& recv_bytes) override {
    CheckParts(send_bytes.size(), "alltoall");
    CheckParts(recv_bytes.size(), "alltoall");
    const std::vector<size_t> send_at = Offsets(send_bytes), recv_at = Offsets(recv_bytes);
    GC_NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      if (send_bytes[p] > 0) GC_NCCL_CHECK(ncclSend(Bytes(in, send_at[p]), send_bytes[p], ncclUint8, p, comm_, stream_));
      if (recv_bytes[p] > 0) GC_NCCL_CHECK(ncclRecv(Bytes(out, recv_at[p]), recv_bytes[p], ncclUint8, p, comm_, stream_));
    }
    GC_NCCL_CHECK(ncclGroupEnd());
    if (send_bytes[rank_] > 0) {
      GC_CUDA_CHECK(cudaMemcpyAsync(Bytes(out, recv_at[rank_]), Bytes(in, send_at[rank_]), send_bytes[rank_],
                                    cudaMemcpyDeviceToDevice, stream_));
    }
    Wait();
  }
  std::unique_ptr<Communicator> Split(int color, int key) override {
    ncclComm_t child = nullptr;
    GC_NCCL_CHECK(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, nullptr));
    if (color < 0) return nullptr;
    return std::make_unique<NcclCommunicator>(child, device_);
  }
  std::unique_ptr<Communicator> SplitLocal(int /*forced_local_size*/) override {
    throw InvalidArgument(
        "NCCL communicator: node-local groups are formed on the MPI communicator (Topology), then given NCCL");
  }

 private:
  void Wait() { GC_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  void CheckParts(size_t parts, const char* what) const {
    if (parts != static_cast<size_t>(size_)) {
      throw InvalidArgument(std::string("NCCL ") + what + ": " + std::to_string(parts) + " parts for " +
                            std::to_string(size_) + " ranks");
    }
  }

  ncclComm_t comm_;
  int device_;
  int rank_ = 0;
  int size_ = 0;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
};

}  // namespace

int NcclVersionCode() { return NCCL_VERSION_CODE; }

std::unique_ptr<Communicator> CreateNcclCommunicator(Communicator& bootstrap, int device) {
  const int rank_ = bootstrap.rank();  // for the check macros
  GC_CUDA_CHECK(cudaSetDevice(device));
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) GC_NCCL_CHECK(ncclGetUniqueId(&id));
  bootstrap.Broadcast(&id, sizeof(id), 0);
  ncclComm_t comm = nullptr;
  GC_NCCL_CHECK(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()));
  return std::make_unique<NcclCommunicator>(comm, device);
}

}  // namespace gradcomp
