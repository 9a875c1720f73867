// The NCCL communicator against the MPI one: every operation on device buffers gives what the
// MPI communicator gives on the same host data. Run under mpirun with one GPU per rank
// (NCCL refuses two ranks on one GPU): `mpirun -np <GPUs> build/test/test_nccl_communicator`.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "ops/comm/mpi_communicator.h"
#include "ops/comm/mpi_environment.h"
#include "ops/comm/nccl_communicator.h"

namespace gradcomp {
namespace {

struct Device {
  void* ptr = nullptr;
  size_t bytes;
  explicit Device(size_t n) : bytes(n) { cudaMalloc(&ptr, n == 0 ? 1 : n); }
  ~Device() { cudaFree(ptr); }
  void Put(const void* host) { cudaMemcpy(ptr, host, bytes, cudaMemcpyHostToDevice); }
  std::vector<uint8_t> Get() const {
    std::vector<uint8_t> out(bytes);
    cudaMemcpy(out.data(), ptr, bytes, cudaMemcpyDeviceToHost);
    return out;
  }
};

std::vector<uint8_t> Bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

class NcclVsMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    EnsureMpiInitialized();
    mpi_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
    int devices = 0;
    ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
    ASSERT_GE(devices, 1) << "this test needs a CUDA device";
    nccl_ = CreateNcclCommunicator(*mpi_, mpi_->rank() % devices);
  }
  std::vector<float> Data(size_t n, int salt) const {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + static_cast<size_t>(mpi_->rank()) * 3 + salt) % 11);
    return v;
  }
  std::unique_ptr<MpiCommunicator> mpi_;
  std::unique_ptr<Communicator> nccl_;
};

TEST_F(NcclVsMpi, EveryOperation) {
  const int n = mpi_->size(), me = mpi_->rank();
  ASSERT_EQ(nccl_->size(), n);
  ASSERT_EQ(nccl_->rank(), me);
  EXPECT_STREQ(nccl_->kind(), "nccl");
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    std::vector<float> in = Data(1000, static_cast<int>(op)), want(in.size());
    mpi_->Allreduce(in.data(), want.data(), in.size(), DataType::kFloat32, op);
    Device d(in.size() * 4);
    d.Put(in.data());
    nccl_->Allreduce(d.ptr, d.ptr, in.size(), DataType::kFloat32, op);
    EXPECT_EQ(d.Get(), Bytes(want)) << ReduceOpName(op);
  }
  for (bool even : {true, false}) {
    std::vector<size_t> counts(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = even ? 64 : 10 + 3 * static_cast<size_t>(r);
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    std::vector<float> in = Data(total, 1), want(counts[static_cast<size_t>(me)]);
    mpi_->ReduceScatter(in.data(), want.data(), counts, DataType::kFloat32, ReduceOp::kSum);
    Device din(total * 4), dout(want.size() * 4);
    din.Put(in.data());
    nccl_->ReduceScatter(din.ptr, dout.ptr, counts, DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(dout.Get(), Bytes(want)) << "reduce-scatter even=" << even;

    std::vector<size_t> bytes(counts);
    for (auto& b : bytes) b *= 4;
    std::vector<float> mine = Data(counts[static_cast<size_t>(me)], 2), all(total);
    mpi_->Allgatherv(mine.data(), all.data(), bytes);
    Device dmine(bytes[static_cast<size_t>(me)]), dall(total * 4);
    dmine.Put(mine.data());
    nccl_->Allgatherv(dmine.ptr, dall.ptr, bytes);
    EXPECT_EQ(dall.Get(), Bytes(all)) << "allgather even=" << even;

    std::vector<float> gathered(total, 0.0f);
    mpi_->Gatherv(mine.data(), gathered.data(), bytes, n - 1);
    Device dg(total * 4);
    nccl_->Gatherv(dmine.ptr, dg.ptr, bytes, n - 1);
    if (me == n - 1) {
      EXPECT_EQ(dg.Get(), Bytes(gathered)) << "gather even=" << even;
    }

    std::vector<float> a2a(total);
    std::vector<size_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
    for (int p = 0; p < n; ++p) {
      send[static_cast<size_t>(p)] = 4 * (static_cast<size_t>(me + p) % 3 + 1);
      recv[static_cast<size_t>(p)] = 4 * (static_cast<size_t>(p + me) % 3 + 1);
    }
    const size_t send_total = std::accumulate(send.begin(), send.end(), size_t{0});
    const size_t recv_total = std::accumulate(recv.begin(), recv.end(), size_t{0});
    std::vector<float> sin = Data(send_total / 4, 3), sout(recv_total / 4);
    mpi_->Alltoallv(sin.data(), send, sout.data(), recv);
    Device dsin(send_total), dsout(recv_total);
    dsin.Put(sin.data());
    nccl_->Alltoallv(dsin.ptr, send, dsout.ptr, recv);
    EXPECT_EQ(dsout.Get(), Bytes(sout)) << "alltoall";
  }
  std::vector<float> b = Data(333, 4);
  Device db(b.size() * 4);
  db.Put(b.data());
  nccl_->Broadcast(db.ptr, db.bytes, 0);
  mpi_->Broadcast(b.data(), b.size() * 4, 0);
  EXPECT_EQ(db.Get(), Bytes(b));
  nccl_->Barrier();
  if (n >= 2) {
    std::vector<float> s = Data(100, 5), r(100);
    const int right = (me + 1) % n, left = (me + n - 1) % n;
    mpi_->SendRecv(s.data(), 400, right, r.data(), 400, left, 9);
    Device ds(400), dr(400);
    ds.Put(s.data());
    nccl_->SendRecv(ds.ptr, 400, right, dr.ptr, 400, left, 9);
    EXPECT_EQ(dr.Get(), Bytes(r));
  }
  auto half = nccl_->Split(me % 2, me);
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(half->size(), (n + 1 - me % 2) / 2);
}

}  // namespace
}  // namespace gradcomp

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
