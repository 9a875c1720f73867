// The NCCL communicator against a reference communicator: every operation on device buffers
// gives what the reference gives on the same host data.
//  - On GPUs: the MPI communicator as the reference, under mpirun with one GPU per rank (NCCL
//    refuses two ranks on one GPU): `mpirun -np <GPUs> build/test/test_nccl_communicator`.
//  - Everywhere (test_nccl_communicator_emulated, GRADCOMP_TEST_THREAD_RANKS): on the emulated
//    CUDA runtime and NCCL (test/support/cuda_emulation/nccl.h), thread ranks of one process with
//    an emulated GPU each, in worlds of 1 to 4, against the in-process communicator.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "ops/comm/nccl_communicator.h"
#include "ops/common/enforce.h"
#include "ops/compression/codec.h"
#include "ops/reduce/reduce.h"
#if GRADCOMP_TEST_THREAD_RANKS
#include <nccl.h>  // the emulated NCCL's

#include "test/support/harness.h"
#else
#include <mpi.h>

#include "ops/comm/mpi_communicator.h"
#include "ops/comm/mpi_environment.h"
#endif

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

// Rank `rank`'s test values: small integers, exact in any order of summation.
std::vector<float> RankData(size_t n, int salt, int rank) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + static_cast<size_t>(rank) * 3 + salt) % 11);
  return v;
}

// Every operation of `nccl` against `ref` (the same ranks), on this rank.
void EveryOperation(Communicator& ref, Communicator& nccl) {
  const auto Data = [&](size_t n, int salt) { return RankData(n, salt, ref.rank()); };
  const int n = ref.size(), me = ref.rank();
  ASSERT_EQ(nccl.size(), n);
  ASSERT_EQ(nccl.rank(), me);
  EXPECT_STREQ(nccl.kind(), "nccl");
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    std::vector<float> in = Data(1000, static_cast<int>(op)), want(in.size());
    ref.Allreduce(in.data(), want.data(), in.size(), DataType::kFloat32, op);
    Device d(in.size() * 4);
    d.Put(in.data());
    nccl.Allreduce(d.ptr, d.ptr, in.size(), DataType::kFloat32, op);
    EXPECT_EQ(d.Get(), Bytes(want)) << ReduceOpName(op);
  }
  // The 16-bit floats (summed in float32 and rounded back, as the host's), and integers.
  for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16, DataType::kInt32}) {
    const std::vector<float> values = Data(300, 7);
    std::vector<uint8_t> in(values.size() * DataTypeSize(dtype)), want(in.size());
    if (dtype == DataType::kInt32) {
      for (size_t i = 0; i < values.size(); ++i) {
        const auto v = static_cast<int32_t>(values[i]) - 5;
        std::memcpy(in.data() + 4 * i, &v, 4);
      }
    } else {
      CastBuffer(values.data(), DataType::kFloat32, values.size(), in.data(), dtype, false);
    }
    ref.Allreduce(in.data(), want.data(), values.size(), dtype, ReduceOp::kSum);
    Device d(in.size());
    d.Put(in.data());
    nccl.Allreduce(d.ptr, d.ptr, values.size(), dtype, ReduceOp::kSum);
    EXPECT_EQ(d.Get(), want) << DataTypeName(dtype);
  }
  for (bool even : {true, false}) {
    std::vector<size_t> counts(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = even ? 64 : 10 + 3 * static_cast<size_t>(r);
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    std::vector<float> in = Data(total, 1), want(counts[static_cast<size_t>(me)]);
    ref.ReduceScatter(in.data(), want.data(), counts, DataType::kFloat32, ReduceOp::kSum);
    Device din(total * 4), dout(want.size() * 4);
    din.Put(in.data());
    nccl.ReduceScatter(din.ptr, dout.ptr, counts, DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(dout.Get(), Bytes(want)) << "reduce-scatter even=" << even;

    std::vector<size_t> bytes(counts);
    for (auto& b : bytes) b *= 4;
    std::vector<float> mine = Data(counts[static_cast<size_t>(me)], 2), all(total);
    ref.Allgatherv(mine.data(), all.data(), bytes);
    Device dmine(bytes[static_cast<size_t>(me)]), dall(total * 4);
    dmine.Put(mine.data());
    nccl.Allgatherv(dmine.ptr, dall.ptr, bytes);
    EXPECT_EQ(dall.Get(), Bytes(all)) << "allgather even=" << even;

    std::vector<float> gathered(total, 0.0f);
    ref.Gatherv(mine.data(), gathered.data(), bytes, n - 1);
    Device dg(total * 4);
    nccl.Gatherv(dmine.ptr, dg.ptr, bytes, n - 1);
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
    ref.Alltoallv(sin.data(), send, sout.data(), recv);
    Device dsin(send_total), dsout(recv_total);
    dsin.Put(sin.data());
    nccl.Alltoallv(dsin.ptr, send, dsout.ptr, recv);
    EXPECT_EQ(dsout.Get(), Bytes(sout)) << "alltoall";
  }
  std::vector<float> b = Data(333, 4);
  Device db(b.size() * 4);
  db.Put(b.data());
  nccl.Broadcast(db.ptr, db.bytes, 0);
  ref.Broadcast(b.data(), b.size() * 4, 0);
  EXPECT_EQ(db.Get(), Bytes(b));
  nccl.Barrier();
  if (n >= 2) {
    std::vector<float> s = Data(100, 5), r(100);
    const int right = (me + 1) % n, left = (me + n - 1) % n;
    ref.SendRecv(s.data(), 400, right, r.data(), 400, left, 9);
    Device ds(400), dr(400);
    ds.Put(s.data());
    nccl.SendRecv(ds.ptr, 400, right, dr.ptr, 400, left, 9);
    EXPECT_EQ(dr.Get(), Bytes(r));
  }
  auto half = nccl.Split(me % 2, me);
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(half->size(), (n + 1 - me % 2) / 2);
  EXPECT_EQ(half->rank(), me / 2);
  std::unique_ptr<Communicator> ref_half = ref.Split(me % 2, me);
  std::vector<float> h = Data(50, 6), h_want(h.size());
  ref_half->Allreduce(h.data(), h_want.data(), h.size(), DataType::kFloat32, ReduceOp::kSum);
  Device dh(h.size() * 4);
  dh.Put(h.data());
  half->Allreduce(dh.ptr, dh.ptr, h.size(), DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(dh.Get(), Bytes(h_want)) << "allreduce on a split";
}

#if GRADCOMP_TEST_THREAD_RANKS

using gradcomp::testing::Failures;
using gradcomp::testing::RunRanks;

TEST(NcclVsInProcess, EveryOperation) {
  for (int world = 1; world <= 4; ++world) {
    const auto failures = RunRanks(world, [](Communicator& comm) {
      std::unique_ptr<Communicator> nccl = CreateNcclCommunicator(comm, comm.rank());
      EveryOperation(comm, *nccl);
      return std::string();
    });
    EXPECT_EQ(Failures(failures), "") << "world " << world;
  }
}

// NCCL's own refusals reach the caller as errors naming the rank and the call.
TEST(NcclVsInProcess, TwoRanksOnOneGpuAreAnError) {
  const auto failures = RunRanks(2, [](Communicator& comm) {
    try {
      CreateNcclCommunicator(comm, 0);
      return std::string("no error");
    } catch (const Error& e) {
      const std::string want = "rank " + std::to_string(comm.rank()) + ": ncclCommInitRank";
      const std::string what = e.what();
      return what.find(want) != std::string::npos && what.find("invalid usage") != std::string::npos ? "" : what;
    }
  });
  EXPECT_EQ(Failures(failures), "");
}

TEST(NcclVsInProcess, HostMemoryIsAnInvalidArgument) {
  const auto failures = RunRanks(2, [](Communicator& comm) {
    std::unique_ptr<Communicator> nccl = CreateNcclCommunicator(comm, comm.rank());
    std::vector<float> host(10, 1.0f);
    try {
      nccl->Allreduce(host.data(), host.data(), host.size(), DataType::kFloat32, ReduceOp::kSum);
      return std::string("no error");
    } catch (const Error& e) {
      const std::string what = e.what();
      return what.find("ncclAllReduce") != std::string::npos && what.find("invalid argument") != std::string::npos
                 ? ""
                 : what;
    }
  });
  EXPECT_EQ(Failures(failures), "");
}

// The emulated NCCL names what a buffer that is not the communicator's GPU's memory is.
TEST(NcclEmulation, BuffersNotOnTheCommunicatorsGpuAreNamed) {
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  const auto refused = [&](void* buf, size_t count) {
    EXPECT_EQ(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, nullptr), ncclInvalidArgument);
    return std::string(ncclGetLastError(comm));
  };
  const auto says = [](const std::string& what, const std::string& want) {
    return what.find(want) != std::string::npos && what.find("ncclAllReduce: sendbuff") != std::string::npos &&
           what.find("(rank 0 of communicator") != std::string::npos;
  };
  std::vector<float> host(10);
  EXPECT_PRED2(says, refused(host.data(), 10), "(40 bytes) is pageable host memory, not GPU 1's");
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, 40), cudaSuccess);
  EXPECT_PRED2(says, refused(pinned, 10), "(40 bytes) is page-locked host memory, not GPU 1's");
  void* other = nullptr;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&other, 40), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  EXPECT_PRED2(says, refused(other, 10), "(40 bytes) is GPU 0's memory at byte 0 of an allocation of 40 bytes, not "
                                         "GPU 1's");
  void* mine = nullptr;
  ASSERT_EQ(cudaMalloc(&mine, 40), cudaSuccess);
  EXPECT_PRED2(says, refused(static_cast<char*>(mine) + 8, 10),
               "(40 bytes) is GPU 1's memory at byte 8 of an allocation of 40 bytes, which it overruns, not GPU 1's");
  EXPECT_EQ(ncclAllReduce(mine, mine, 10, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(mine);
  cudaFree(other);
  cudaFreeHost(pinned);
  ncclCommDestroy(comm);
  cudaSetDevice(0);
}

// Ranks that disagree on a collective, or on a message's size, stop with both calls named (NCCL
// would hang or mix the buffers up).
TEST(NcclEmulationDeathTest, RanksThatDisagreeStop) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto run = [](const std::function<void(Communicator&, Device&)>& body) {
    RunRanks(2, [&](Communicator& comm) {
      std::unique_ptr<Communicator> nccl = CreateNcclCommunicator(comm, comm.rank());
      Device d(400);
      body(*nccl, d);
      return std::string();
    });
  };
  EXPECT_DEATH(run([](Communicator& nccl, Device& d) {
                 if (nccl.rank() == 0) nccl.Allreduce(d.ptr, d.ptr, 100, DataType::kFloat32, ReduceOp::kSum);
                 if (nccl.rank() == 1) nccl.Broadcast(d.ptr, 400, 0);
               }),
               "collective #0 of communicator [0-9]+ \\(2 ranks\\): rank 0 called ncclAllReduce\\(100 float32, sum\\), "
               "rank 1 ncclBroadcast\\(400 uint8, root 0\\)");
  EXPECT_DEATH(run([](Communicator& nccl, Device& d) {
                 if (nccl.rank() == 0) nccl.Send(d.ptr, 400, 1, 0);
                 if (nccl.rank() == 1) nccl.Recv(d.ptr, 200, 0, 0);
               }),
               "rank 1 of communicator [0-9]+ \\(2 ranks\\), in ncclRecv\\(200 uint8, peer 0\\), received rank 0's "
               "ncclSend\\(400 uint8, peer 1\\) of 400 bytes");
}

#else

TEST(NcclVsMpi, EveryOperation) {
  EnsureMpiInitialized();
  MpiCommunicator mpi(MPI_COMM_WORLD);
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  ASSERT_GE(devices, 1) << "this test needs a CUDA device";
  std::unique_ptr<Communicator> nccl = CreateNcclCommunicator(mpi, mpi.rank() % devices);
  EveryOperation(mpi, *nccl);
}

#endif

}  // namespace
}  // namespace gradcomp

#if !GRADCOMP_TEST_THREAD_RANKS
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
#endif
