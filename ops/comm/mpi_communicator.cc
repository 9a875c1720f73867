#include "ops/comm/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <numeric>

#include "ops/reduce/reduce.h"

namespace gradcomp {

std::string MpiErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return std::string(text, static_cast<size_t>(len));
}

std::string MpiErrorMessage(int code, const char* operation, int rank) {
  return detail::StrCat("MPI error on rank ", rank, " in ", operation, ": ", MpiErrorText(code), " (code ", code, ")");
}

MPI_Datatype MpiDataType(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kInt16: return MPI_INT16_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat16: return MPI_UINT16_T;  // reduced only through our user ops
    case DataType::kBFloat16: return MPI_UINT16_T;
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kBool: return MPI_C_BOOL;
  }
  GC_THROW("no MPI datatype for data type code ", static_cast<int>(dtype));
}

namespace {

constexpr size_t kMaxMpiCount = static_cast<size_t>(INT_MAX);
// Collectives up to this size (allreduce, allgather, gather, broadcast, alltoall; barriers
// always) are started nonblocking and polled with naps (PollUntil): they are latency-bound,
// and a rank that reaches one before its peers (a backward pass's small tensors, every cycle,
// the coordinator's slow path) would otherwise busy-poll inside MPI on a core training needs.
// Larger ones stay blocking: their progress needs MPI's attention all along (shared memory's
// copies).
constexpr size_t kPolledCollectiveBytes = 256 << 10;

// MPI user-op body: inout[i] = in[i] (op) inout[i] (our ops are commutative).
template <DataType D, ReduceOp O>
void HalfReduce(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  ReduceInto(inout, in, static_cast<size_t>(*len), D, O);
}

template <DataType D>
void CreateHalfOps(MPI_Op (&ops)[4]) {
  MPI_Op_create(&HalfReduce<D, ReduceOp::kSum>, 1, &ops[0]);
  MPI_Op_create(&HalfReduce<D, ReduceOp::kMin>, 1, &ops[1]);
  MPI_Op_create(&HalfReduce<D, ReduceOp::kMax>, 1, &ops[2]);
  MPI_Op_create(&HalfReduce<D, ReduceOp::kProduct>, 1, &ops[3]);
}

int OpIndex(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return 0;
    case ReduceOp::kMin: return 1;
    case ReduceOp::kMax: return 2;
    case ReduceOp::kProduct: return 3;
    case ReduceOp::kAverage:
    case ReduceOp::kBitwiseAnd:
    case ReduceOp::kAdasum: break;
  }
  GC_ENFORCE(op != ReduceOp::kAdasum, "Adasum runs over point-to-point messages (ops/collectives/adasum.h), "
             "never as the communicator's reduction");
  GC_ENFORCE(false, "Average must be lowered to Sum before reaching the communicator");
  return -1;
}

int ToInt(size_t n, const char* what, int rank) {
  if (n > kMaxMpiCount) {
    GC_THROW("MPI rank ", rank, ": ", what, " of ", n, " exceeds MPI's count limit ", INT_MAX,
             " (split the tensor)");
  }
  return static_cast<int>(n);
}

// Throws when a completed receive got other than `bytes` bytes (MPI accepts shorter messages).
void CheckReceived(const MPI_Status& status, size_t bytes, int rank) {
  int got = 0;
  const int rc = MPI_Get_count(&status, MPI_BYTE, &got);
  if (rc != MPI_SUCCESS) throw Error(MpiErrorMessage(rc, "MPI_Get_count", rank));
  if (static_cast<size_t>(got) != bytes) {
    GC_THROW("MPI rank ", rank, ": message from rank ", status.MPI_SOURCE, " has ", got, " bytes, expected ", bytes);
  }
}

std::vector<int> ToInts(const std::vector<size_t>& v, const char* what, int rank) {
  std::vector<int> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = ToInt(v[i], what, rank);
  return out;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, Device* device_memory) : device_memory_(device_memory) {
  int rc = MPI_Comm_dup(comm, &comm_);
  if (rc != MPI_SUCCESS) throw Error(MpiErrorMessage(rc, "MPI_Comm_dup", -1));
  GC_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  GC_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  GC_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  CreateHalfOps<DataType::kFloat16>(half_ops_[0]);
  CreateHalfOps<DataType::kBFloat16>(half_ops_[1]);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // MPI already released everything
  for (auto& per_dtype : half_ops_) {
    for (MPI_Op& op : per_dtype) MPI_Op_free(&op);
  }
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

MPI_Op MpiCommunicator::OpFor(DataType dtype, ReduceOp op) const {
  if (op == ReduceOp::kBitwiseAnd) return MPI_BAND;
  const int index = OpIndex(op);
  if (dtype == DataType::kFloat16) return half_ops_[0][index];
  if (dtype == DataType::kBFloat16) return half_ops_[1][index];
  if (dtype == DataType::kBool) return (op == ReduceOp::kSum || op == ReduceOp::kMax) ? MPI_LOR : MPI_LAND;
  static const MPI_Op kBuiltin[4] = {MPI_SUM, MPI_MIN, MPI_MAX, MPI_PROD};
  return kBuiltin[index];
}

void MpiCommunicator::Send(const void* data, size_t bytes, int peer, int tag) {
  GC_MPI_CHECK(MPI_Send(data, ToInt(bytes, "send size", rank_), MPI_BYTE, peer, tag, comm_));
}

void MpiCommunicator::Recv(void* data, size_t bytes, int peer, int tag) {
  MPI_Status status;
  GC_MPI_CHECK(MPI_Recv(data, ToInt(bytes, "receive size", rank_), MPI_BYTE, peer, tag, comm_, &status));
  CheckReceived(status, bytes, rank_);
}

void MpiCommunicator::SendRecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes,
                               int src, int tag) {
  GC_MPI_CHECK(MPI_Sendrecv(send, ToInt(send_bytes, "send size", rank_), MPI_BYTE, dst, tag, recv,
                            ToInt(recv_bytes, "receive size", rank_), MPI_BYTE, src, tag, comm_,
                            MPI_STATUS_IGNORE));
}

void MpiCommunicator::Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) {
  const size_t esize = DataTypeSize(dtype);
  if (count * esize <= kPolledCollectiveBytes) {
    const std::unique_ptr<PendingTransfer> t = Iallreduce(in, out, count, dtype, op);
    PollUntil([&] { return t->Test(); });
    return;
  }
  const MPI_Datatype type = MpiDataType(dtype);
  const MPI_Op mpi_op = OpFor(dtype, op);
  // MPI counts are int: very large buffers go through in pieces.
  for (size_t done = 0; done < count; done += kMaxMpiCount) {
    const size_t n = std::min(kMaxMpiCount, count - done);
    char* dst = static_cast<char*>(out) + done * esize;
    const void* src = (in == out) ? MPI_IN_PLACE : static_cast<const char*>(in) + done * esize;
    GC_MPI_CHECK(MPI_Allreduce(src, dst, static_cast<int>(n), type, mpi_op, comm_));
  }
}

void MpiCommunicator::ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                                    DataType dtype, ReduceOp op) {
  GC_ENFORCE(counts.size() == static_cast<size_t>(size_), "reducescatter needs one count per rank");
  const std::vector<int> icounts = ToInts(counts, "reducescatter count", rank_);
  GC_MPI_CHECK(MPI_Reduce_scatter(in, out, icounts.data(), MpiDataType(dtype), OpFor(dtype, op), comm_));
}

namespace {
// An MPI_Isend / MPI_Irecv request.
class MpiTransfer final : public PendingTransfer {
 public:
  MpiTransfer(bool receive, int rank, size_t bytes) : receive_(receive), rank_(rank), bytes_(bytes) {}
  ~MpiTransfer() override {
    // Abandoned (an error elsewhere): cancel rather than wait for a peer that may never come.
    if (request_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&request_);
      MPI_Wait(&request_, MPI_STATUS_IGNORE);
    }
  }
  MPI_Request* request() { return &request_; }
  bool Test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    MPI_Status status;
    GC_MPI_CHECK(MPI_Test(&request_, &done, &status));
    if (done && receive_) CheckReceived(status, bytes_, rank_);
    return done != 0;
  }

 private:
  const bool receive_;
  const int rank_;  // for GC_MPI_CHECK
  const size_t bytes_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

// A nonblocking collective's request. It cannot be cancelled: one abandoned by an error is
// left to MPI_Abort (the runtime abandons the world on any error).
class MpiCollectiveTransfer final : public PendingTransfer {
 public:
  explicit MpiCollectiveTransfer(int rank) : rank_(rank) {}
  MPI_Request* request() { return &request_; }
  bool Test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    GC_MPI_CHECK(MPI_Test(&request_, &done, MPI_STATUS_IGNORE));
    return done != 0;
  }

 private:
  const int rank_;  // for GC_MPI_CHECK
  MPI_Request request_ = MPI_REQUEST_NULL;
};
}  // namespace

std::unique_ptr<PendingTransfer> MpiCommunicator::Iallreduce(const void* in, void* out, size_t count,
                                                             DataType dtype, ReduceOp op) {
  GC_ENFORCE(count <= kMaxMpiCount, "Iallreduce takes at most " + std::to_string(kMaxMpiCount) +
                                        " elements, got " + std::to_string(count));
  auto t = std::make_unique<MpiCollectiveTransfer>(rank_);
  const void* src = (in == out) ? MPI_IN_PLACE : in;
  GC_MPI_CHECK(MPI_Iallreduce(src, out, static_cast<int>(count), MpiDataType(dtype), OpFor(dtype, op), comm_,
                              t->request()));
  return t;
}

void MpiCommunicator::Barrier() {
  // Polled like the small collectives: a rank that arrives first naps instead of spinning inside
  // MPI_Barrier on a core training needs (one node, 2 ranks, ResNet-20, when the shared-memory
  // allreduce synced through it: MPI_Barrier's spin was 43% of the background thread's CPU; its
  // syncs are ShmBarrier's now).
  MpiCollectiveTransfer t(rank_);
  GC_MPI_CHECK(MPI_Ibarrier(comm_, t.request()));
  PollUntil([&] { return t.Test(); });
}

std::unique_ptr<PendingTransfer> MpiCommunicator::Isend(const void* data, size_t bytes, int peer, int tag) {
  auto t = std::make_unique<MpiTransfer>(false, rank_, bytes);
  GC_MPI_CHECK(MPI_Isend(data, ToInt(bytes, "send size", rank_), MPI_BYTE, peer, tag, comm_, t->request()));
  return t;
}

std::unique_ptr<PendingTransfer> MpiCommunicator::Irecv(void* data, size_t bytes, int peer, int tag) {
  auto t = std::make_unique<MpiTransfer>(true, rank_, bytes);
  GC_MPI_CHECK(MPI_Irecv(data, ToInt(bytes, "receive size", rank_), MPI_BYTE, peer, tag, comm_, t->request()));
  return t;
}

void MpiCommunicator::Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) {
  GC_ENFORCE(bytes.size() == static_cast<size_t>(size_), "allgather needs one size per rank");
  const std::vector<int> counts = ToInts(bytes, "allgather size", rank_);
  const std::vector<int> displs = ToInts(Offsets(bytes), "allgather offset", rank_);
  const void* src = in;
  if (static_cast<const char*>(out) + displs[static_cast<size_t>(rank_)] == in) src = MPI_IN_PLACE;
  if (std::accumulate(bytes.begin(), bytes.end(), size_t{0}) <= kPolledCollectiveBytes) {
    MpiCollectiveTransfer t(rank_);
    GC_MPI_CHECK(MPI_Iallgatherv(src, counts[static_cast<size_t>(rank_)], MPI_BYTE, out, counts.data(),
                                 displs.data(), MPI_BYTE, comm_, t.request()));
    PollUntil([&] { return t.Test(); });
    return;
  }
  GC_MPI_CHECK(MPI_Allgatherv(src, counts[static_cast<size_t>(rank_)], MPI_BYTE, out, counts.data(),
                              displs.data(), MPI_BYTE, comm_));
}

void MpiCommunicator::Gatherv(const void* in, void* out, const std::vector<size_t>& bytes, int root) {
  GC_ENFORCE(bytes.size() == static_cast<size_t>(size_), "gather needs one size per rank");
  const std::vector<int> counts = ToInts(bytes, "gather size", rank_);
  const std::vector<int> displs = ToInts(Offsets(bytes), "gather offset", rank_);
  if (std::accumulate(bytes.begin(), bytes.end(), size_t{0}) <= kPolledCollectiveBytes) {
    MpiCollectiveTransfer t(rank_);
    GC_MPI_CHECK(MPI_Igatherv(in, counts[static_cast<size_t>(rank_)], MPI_BYTE, out, counts.data(), displs.data(),
                              MPI_BYTE, root, comm_, t.request()));
    PollUntil([&] { return t.Test(); });
    return;
  }
  GC_MPI_CHECK(MPI_Gatherv(in, counts[static_cast<size_t>(rank_)], MPI_BYTE, out, counts.data(), displs.data(),
                           MPI_BYTE, root, comm_));
}

void MpiCommunicator::Broadcast(void* data, size_t bytes, int root) {
  if (bytes <= kPolledCollectiveBytes) {  // the coordinator's replies, every slow path
    MpiCollectiveTransfer t(rank_);
    GC_MPI_CHECK(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_, t.request()));
    PollUntil([&] { return t.Test(); });
    return;
  }
  for (size_t done = 0; done < bytes; done += kMaxMpiCount) {
    const size_t n = std::min(kMaxMpiCount, bytes - done);
    GC_MPI_CHECK(MPI_Bcast(static_cast<char*>(data) + done, static_cast<int>(n), MPI_BYTE, root, comm_));
  }
}

void MpiCommunicator::Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                                const std::vector<size_t>& recv_bytes) {
  GC_ENFORCE(send_bytes.size() == static_cast<size_t>(size_) && recv_bytes.size() == send_bytes.size(),
             "alltoall needs one size per rank");
  const std::vector<int> sc = ToInts(send_bytes, "alltoall send size", rank_);
  const std::vector<int> sd = ToInts(Offsets(send_bytes), "alltoall send offset", rank_);
  const std::vector<int> rc = ToInts(recv_bytes, "alltoall receive size", rank_);
  const std::vector<int> rd = ToInts(Offsets(recv_bytes), "alltoall receive offset", rank_);
  size_t total = 0;
  for (size_t i = 0; i < send_bytes.size(); ++i) total += send_bytes[i] + recv_bytes[i];
  if (total <= kPolledCollectiveBytes) {
    MpiCollectiveTransfer t(rank_);
    GC_MPI_CHECK(MPI_Ialltoallv(in, sc.data(), sd.data(), MPI_BYTE, out, rc.data(), rd.data(), MPI_BYTE, comm_,
                                t.request()));
    PollUntil([&] { return t.Test(); });
    return;
  }
  GC_MPI_CHECK(MPI_Alltoallv(in, sc.data(), sd.data(), MPI_BYTE, out, rc.data(), rd.data(), MPI_BYTE, comm_));
}

std::unique_ptr<Communicator> MpiCommunicator::Split(int color, int key) {
  MPI_Comm sub = MPI_COMM_NULL;
  GC_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub));
  if (sub == MPI_COMM_NULL) return nullptr;
  auto result = std::make_unique<MpiCommunicator>(sub);
  MPI_Comm_free(&sub);  // MpiCommunicator keeps its own duplicate
  return result;
}

std::unique_ptr<Communicator> MpiCommunicator::SplitLocal(int forced_local_size) {
  // The real node: ranks that can share memory.
  MPI_Comm shared = MPI_COMM_NULL;
  GC_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shared));
  MPI_Comm node = shared;
  if (forced_local_size > 0) {
    if (size_ % forced_local_size != 0) {
      MPI_Comm_free(&shared);
      GC_THROW("GRADCOMP_LOCAL_SIZE=", forced_local_size, " does not divide the world size ", size_,
               " (rank ", rank_, ")");
    }
    // Forced groups of consecutive ranks, each inside one shared-memory domain.
    GC_MPI_CHECK(MPI_Comm_split(shared, rank_ / forced_local_size, rank_, &node));
    int group_size = 0;
    MPI_Comm_size(node, &group_size);
    MPI_Comm_free(&shared);
    if (group_size != forced_local_size) {
      MPI_Comm_free(&node);
      GC_THROW("GRADCOMP_LOCAL_SIZE=", forced_local_size, ": rank ", rank_, "'s group of consecutive ranks spans ",
               "more than one machine (only ", group_size, " of them share memory)");
    }
  }
  auto result = std::make_unique<MpiCommunicator>(node);
  MPI_Comm_free(&node);  // MpiCommunicator keeps its own duplicate
  return result;
}

}  // namespace gradcomp
