// The runtime with its tensors on a device: a few training-like steps (fused and single
// tensors, float32 and float16, the layer filter's uncompressed tensors next to compressed
// ones, error feedback and DGC memories carried across steps, a broadcast) run once with
// every tensor on the host and again with every tensor on the test device (and with half of
// them there), through host staging and through communicators that take device memory, and
// every step must give the same bytes. The test device is the separate-memory device
// (test_runtime_device) or GPU 0 of the emulated CUDA runtime, whose kernels then do the device's
// work (test_runtime_device_emulated, which also runs a GPU a rank with NCCL at every level).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/runtime.h"
#include "ops/common/enforce.h"
#include "ops/compression/cast_codec.h"
#include "ops/reduce/reduce.h"
#include "test/support/device_comm.h"
#include "test/support/device_twin.h"
#include "test/support/harness.h"
#include "test/support/sra_reference.h"
#if GRADCOMP_CUDA_EMULATION
#include <nccl.h>  // the emulated NCCL's

#include "ops/device/cuda_device.h"
#endif

namespace gradcomp {
namespace {

using namespace gradcomp::testing;

enum class Where { kHost, kDevice, kMixed };

struct Tensor {
  std::string name;
  DataType dtype;
  std::vector<int64_t> shape;
};

const std::vector<Tensor>& Model() {
  static const std::vector<Tensor> model = {
      {"conv.weight", DataType::kFloat32, {64, 3, 3, 3}},  {"conv.bias", DataType::kFloat32, {64}},
      {"fc1.weight", DataType::kFloat32, {512, 300}},      {"fc1.bias", DataType::kFloat32, {512}},
      {"fc2.weight", DataType::kFloat16, {100, 512}},      {"fc2.bias", DataType::kFloat16, {100}},
      {"big.weight", DataType::kFloat32, {1024, 1030}},
  };
  return model;
}

size_t Bytes(const Tensor& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  return static_cast<size_t>(n) * DataTypeSize(t.dtype);
}

// The bytes of tensor i's gradient at `step` on `rank`.
std::vector<char> GradientBytes(const Tensor& t, int rank, int step) {
  const size_t n = Bytes(t) / DataTypeSize(t.dtype);
  const std::vector<float> g = Gradient(n, rank + 100 * step, 0.5, static_cast<unsigned>(t.name.size()));
  std::vector<char> out(Bytes(t));
  CastBuffer(g.data(), DataType::kFloat32, n, out.data(), t.dtype, false);
  return out;
}

// Every rank's results, step after step, tensor after tensor, as bytes.
using Results = std::vector<std::vector<char>>;

// A runtime's options for thread rank `comm`: a world of its own split from it, the settings of
// `vars`, and with `device_comms` communicators that take the device's memory (as NCCL would be
// for GPU tensors; test/support/device_comm.h).
RuntimeOptions OptionsFor(Communicator& comm, const std::map<std::string, std::string>& vars = {},
                          bool device_comms = false) {
  RuntimeOptions options;
  options.settings = Settings::FromMap(vars);
  options.world = comm.Split(0, comm.rank());
  if (device_comms) {
    options.device_communicators = [](Communicator& host, Device& device, CommLevel) {
      return DeviceMemoryCommunicator(host, device);
    };
  }
  return options;
}

// With `device_comms` the runtime gets communicators that take the device's memory (OptionsFor).
// Rank r's device is device_of(r), else the test device. The allreduces reduce with `op`.
Results Train(int world, const std::map<std::string, std::string>& vars, Where where, bool device_comms = false,
              const std::function<Device&(int)>& device_of = nullptr, ReduceOp op = ReduceOp::kAverage) {
  const int steps = 3;
  Results results(static_cast<size_t>(world));
  const std::vector<std::string> failures = RunRanks(world, [&](Communicator& comm) {
    Runtime rt(OptionsFor(comm, vars, device_comms));
    Device& dev = device_of ? device_of(rt.rank()) : TestDevice();
    const auto& model = Model();
    std::unique_ptr<Stream> stream = dev.NewStream();
    // Buffers: host vectors, and device copies for the tensors placed on the device.
    std::vector<std::vector<char>> host(model.size());
    std::vector<void*> device(model.size(), nullptr);
    const auto on_device = [&](size_t i) { return where == Where::kDevice || (where == Where::kMixed && i % 2 == 0); };
    for (size_t i = 0; i < model.size(); ++i) {
      host[i].resize(Bytes(model[i]));
      if (on_device(i)) device[i] = dev.Allocate(Bytes(model[i]));
    }
    std::vector<char>& mine = results[static_cast<size_t>(rt.rank())];
    uint64_t after_first_step = 0;
    for (int step = 0; step < steps; ++step) {
      // One group per dtype, each negotiated in one cycle, so that fusion (which decides the
      // chunks a compressed allreduce quantizes) is the same in every run.
      std::vector<std::shared_ptr<Handle>> handles;
      for (DataType dtype : {DataType::kFloat32, DataType::kFloat16}) {
        std::vector<std::string> names;
        std::vector<std::vector<int64_t>> shapes;
        std::vector<const void*> inputs;
        std::vector<void*> outputs;
        std::vector<Placement> placements;
        for (size_t i = 0; i < model.size(); ++i) {
          if (model[i].dtype != dtype) continue;
          host[i] = GradientBytes(model[i], rt.rank(), step);
          void* buf = host[i].data();
          if (on_device(i)) {
            dev.CopyFromHost(device[i], host[i].data(), host[i].size(), *stream);
            buf = device[i];
          }
          names.push_back(model[i].name);
          shapes.push_back(model[i].shape);
          inputs.push_back(buf);
          outputs.push_back(buf);
          placements.push_back(on_device(i) ? Placement{&dev, stream.get()} : Placement{});
        }
        const auto h = rt.GroupedAllreduce(names, dtype, shapes, inputs, outputs, op, 1.0, 1.0, nullptr, placements);
        handles.insert(handles.end(), h.begin(), h.end());
      }
      for (auto& h : handles) h->Wait();
      // A broadcast of the first tensor from the last rank, where it lies.
      void* first = on_device(0) ? device[0] : host[0].data();
      rt.Broadcast("bcast", model[0].dtype, model[0].shape, first, rt.size() - 1,
                   on_device(0) ? Placement{&dev, stream.get()} : Placement{})
          ->Wait();
      for (size_t i = 0; i < model.size(); ++i) {
        if (on_device(i)) dev.CopyToHost(host[i].data(), device[i], host[i].size(), *stream);
        mine.insert(mine.end(), host[i].begin(), host[i].end());
      }
      if (step == 0) after_first_step = dev.allocations();
    }
    // Steady steps allocate nothing on the device (the ranks' runtimes may share it; each rank
    // checks after its own last step, when the others may still be in theirs: still nothing).
    if (where != Where::kHost && dev.allocations() != after_first_step) {
      return "the device allocated " + std::to_string(dev.allocations() - after_first_step) +
             " times after the first step";
    }
    for (size_t i = 0; i < model.size(); ++i) {
      if (device[i] != nullptr) dev.Free(device[i], Bytes(model[i]));
    }
    return std::string();
  });
  EXPECT_EQ(Failures(failures), "");
  return results;
}

// "" when equal, else where the first byte differs (step and tensor).
std::string FirstDifference(const std::vector<char>& got, const std::vector<char>& want) {
  if (got.size() != want.size()) return "sizes " + std::to_string(got.size()) + " and " + std::to_string(want.size());
  if (got == want) return "";  // one memcmp: the byte loop below costs minutes under TSan
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    for (int step = 0;; ++step) {
      for (const Tensor& t : Model()) {
        if (i < at + Bytes(t)) {
          return "step " + std::to_string(step) + " tensor " + t.name + " byte " + std::to_string(i - at);
        }
        at += Bytes(t);
      }
    }
  }
  return "";
}

class RuntimeOnDevice : public ::testing::TestWithParam<std::map<std::string, std::string>> {};

// Worlds 2 and 3 on the test device; on the emulated GPU (a fiber per CUDA thread, minutes) the
// odd world alone, whose uneven shards are the harder case for the kernels and NCCL.
#if GRADCOMP_CUDA_EMULATION
constexpr int kWorlds[] = {3};
#else
constexpr int kWorlds[] = {2, 3};
#endif

TEST_P(RuntimeOnDevice, SameBytesAsOnTheHostAtEveryStep) {
  for (int world : kWorlds) {
    const Results host = Train(world, GetParam(), Where::kHost);
    for (int r = 1; r < world; ++r) ASSERT_EQ(host[static_cast<size_t>(r)], host[0]) << "ranks differ on the host";
    const Results device = Train(world, GetParam(), Where::kDevice);
    const Results mixed = Train(world, GetParam(), Where::kMixed);
    const size_t before = DeviceMemoryCommunicatorBytes();
    const Results direct = Train(world, GetParam(), Where::kDevice, true);
    ASSERT_GT(DeviceMemoryCommunicatorBytes(), before) << "the device communicators were not used";
    const Results mixed_direct = Train(world, GetParam(), Where::kMixed, true);
#if GRADCOMP_CUDA_EMULATION
    // A GPU a rank, NCCL at every level (the emulation's GPUs and NCCL, whose sums run in rank order).
    std::map<std::string, std::string> nccl_vars = GetParam();
    nccl_vars["GRADCOMP_INNER_COMMUNICATOR"] = "nccl";
    nccl_vars["GRADCOMP_CROSS_COMMUNICATOR"] = "nccl";
    const size_t nccl_before = gc_cuda_emulation::NcclBytes();
    const Results nccl = Train(world, nccl_vars, Where::kDevice, false, [](int rank) -> Device& {
      return CudaDevice(rank);
    });
    ASSERT_GT(gc_cuda_emulation::NcclBytes(), nccl_before) << "NCCL was not used";
#endif
    for (int r = 0; r < world; ++r) {
      const std::vector<char>& want = host[static_cast<size_t>(r)];
      ASSERT_EQ(FirstDifference(device[static_cast<size_t>(r)], want), "")
          << "all on the device, world " << world << " rank " << r;
      ASSERT_EQ(FirstDifference(mixed[static_cast<size_t>(r)], want), "")
          << "half on the device, world " << world << " rank " << r;
      ASSERT_EQ(FirstDifference(direct[static_cast<size_t>(r)], want), "")
          << "all on the device, device communicators, world " << world << " rank " << r;
      ASSERT_EQ(FirstDifference(mixed_direct[static_cast<size_t>(r)], want), "")
          << "half on the device, device communicators, world " << world << " rank " << r;
#if GRADCOMP_CUDA_EMULATION
      ASSERT_EQ(FirstDifference(nccl[static_cast<size_t>(r)], want), "")
          << "a GPU a rank, NCCL, world " << world << " rank " << r;
#endif
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Settings, RuntimeOnDevice,
    ::testing::Values(
        std::map<std::string, std::string>{},
        std::map<std::string, std::string>{{"GRADCOMP_FUSION_THRESHOLD_MB", "0"}},
        std::map<std::string, std::string>{{"GRADCOMP_COMPRESSION", "fp16"}},
        std::map<std::string, std::string>{{"GRADCOMP_COMPRESSION", "maxmin"}, {"GRADCOMP_BITS", "4"},
                                           {"GRADCOMP_ERROR_FEEDBACK", "1"}},
        std::map<std::string, std::string>{{"GRADCOMP_COMPRESSION", "maxmin"}, {"GRADCOMP_BITS", "2"},
                                           {"GRADCOMP_STOCHASTIC", "1"}, {"GRADCOMP_FUSION_THRESHOLD_MB", "0"},
                                           {"GRADCOMP_PIPELINE_STRIPES", "4"}},
        std::map<std::string, std::string>{{"GRADCOMP_COMPRESSION", "topk"}, {"GRADCOMP_TOPK_RATIO", "0.01"},
                                           {"GRADCOMP_TOPK_MOMENTUM", "0.9"}},
        std::map<std::string, std::string>{{"GRADCOMP_COMPRESSION", "topk"}, {"GRADCOMP_TOPK_RATIO", "0.05"},
                                           {"GRADCOMP_ERROR_FEEDBACK", "1"}}),
    [](const ::testing::TestParamInfo<std::map<std::string, std::string>>& p) {
      const auto codec = p.param.find("GRADCOMP_COMPRESSION");
      return std::to_string(p.index) + "_" + (codec == p.param.end() ? "none" : codec->second);
    });

// One rank's tensor on the device, the other's on the host: the response is staged through the
// host on both (device communicators are for tensors in device memory on every rank).
// Adasum is the host's algorithm whatever the tensors' memory: device tensors are staged through
// the host, also where device communicators exist (they have no such op). Tensors on a device on
// every rank combine the nodes' averages, as Horovod's Adasum of GPU tensors: with nodes of one
// rank that is the host's tree of whole ranks, bit for bit; one node of two ranks, their average;
// two nodes of two, neither.
TEST(RuntimeOnDevice, AdasumOfDeviceTensorsCombinesTheNodesAverages) {
  const std::map<std::string, std::string> ranks_as_nodes = {{"GRADCOMP_LOCAL_SIZE", "1"}};
  for (int world : {2, 3}) {
    const Results host = Train(world, {}, Where::kHost, false, nullptr, ReduceOp::kAdasum);
    EXPECT_NE(host, Train(world, {}, Where::kHost)) << "Adasum gave the average";
    for (bool device_comms : {false, true}) {
      const std::string how = device_comms ? " with device communicators" : " staged";
      for (Where where : {Where::kDevice, Where::kMixed}) {
        const Results nodes = Train(world, ranks_as_nodes, where, device_comms, nullptr, ReduceOp::kAdasum);
        for (int r = 0; r < world; ++r) {
          EXPECT_EQ(FirstDifference(nodes[static_cast<size_t>(r)], host[static_cast<size_t>(r)]), "")
              << "world " << world << " rank " << r << (where == Where::kDevice ? " device" : " mixed") << how
              << ", nodes of one rank";
        }
      }
    }
  }
  const Results average = Train(2, {}, Where::kHost);
  const Results one_node = Train(2, {}, Where::kDevice, false, nullptr, ReduceOp::kAdasum);
  for (size_t r = 0; r < 2; ++r) EXPECT_EQ(FirstDifference(one_node[r], average[r]), "") << "one node, rank " << r;
  const std::map<std::string, std::string> two_nodes = {{"GRADCOMP_LOCAL_SIZE", "2"}};
  const Results flat = Train(4, two_nodes, Where::kHost, false, nullptr, ReduceOp::kAdasum);
  const Results of_nodes = Train(4, two_nodes, Where::kDevice, true, nullptr, ReduceOp::kAdasum);
  EXPECT_NE(of_nodes[0], flat[0]) << "two nodes of two: the tree of whole ranks";
  EXPECT_NE(of_nodes[0], Train(4, two_nodes, Where::kHost)[0]) << "two nodes of two: the average";
  for (size_t r = 1; r < 4; ++r) EXPECT_EQ(FirstDifference(of_nodes[r], of_nodes[0]), "") << "rank " << r;
}

TEST(RuntimeOnDevice, RanksThatDisagreeOnWhereATensorIsStageThroughTheHost) {
  const size_t before = DeviceMemoryCommunicatorBytes();
  std::vector<std::vector<float>> out(2);
  RunRanks(2, [&](Communicator& comm) {
    Runtime rt(OptionsFor(comm, {{"GRADCOMP_COMPRESSION", "maxmin"}, {"GRADCOMP_MIN_SIZE", "1"}}, true));
    std::vector<float> x = Gradient(1000, rt.rank(), 0.5);
    std::unique_ptr<Stream> stream = TestDevice().NewStream();
    void* buf = x.data();
    Placement placement;
    if (rt.rank() == 0) {
      buf = TestDevice().Allocate(x.size() * 4);
      TestDevice().CopyFromHost(buf, x.data(), x.size() * 4, *stream);
      placement = {&TestDevice(), stream.get()};
    }
    for (const char* name : {"w", "w2"}) {
      rt.Allreduce(name, DataType::kFloat32, {10, 100}, buf, buf, ReduceOp::kAverage, 1, 1, nullptr, placement)
          ->Wait();
    }
    if (rt.rank() == 0) {
      TestDevice().CopyToHost(x.data(), buf, x.size() * 4, *stream);
      TestDevice().Free(buf, x.size() * 4);
    }
    out[static_cast<size_t>(rt.rank())] = x;
    return std::string();
  });
  EXPECT_EQ(out[0], out[1]);
  EXPECT_EQ(DeviceMemoryCommunicatorBytes(), before);
}

// The collectives whose output the runtime allocates, of tensors on the device: the output is in
// the device's memory, with the host's bytes, staged or over device communicators.
Results Gather(int world, Where where, bool device_comms) {
  Results results(static_cast<size_t>(world));
  const std::vector<std::string> failures = RunRanks(world, [&](Communicator& comm) {
    Runtime rt(OptionsFor(comm, {}, device_comms));
    const int me = rt.rank(), n = rt.size();
    std::unique_ptr<Stream> stream = TestDevice().NewStream();
    const bool dev = where == Where::kDevice;
    const Placement placement = dev ? Placement{&TestDevice(), stream.get()} : Placement{};
    std::vector<std::pair<void*, size_t>> allocated;
    // An input of `t`'s first `rows` rows where the run puts it.
    const auto input = [&](const Tensor& t, int64_t rows, int step) -> const void* {
      static thread_local std::vector<std::vector<char>> keep;
      std::vector<char> bytes = GradientBytes(t, me, step);
      bytes.resize(Bytes(t) / static_cast<size_t>(t.shape[0]) * static_cast<size_t>(rows));
      keep.push_back(bytes);
      if (!dev) return keep.back().data();
      void* d = TestDevice().Allocate(bytes.size());
      TestDevice().CopyFromHost(d, bytes.data(), bytes.size(), *stream);
      allocated.emplace_back(d, bytes.size());
      return d;
    };
    std::vector<char>& mine = results[static_cast<size_t>(me)];
    const auto keep_output = [&](const std::shared_ptr<Handle>& h, const std::string& what) {
      h->Wait();
      if ((h->output_device() != nullptr) != dev) throw Error(what + ": output in the wrong memory");
      const size_t at = mine.size();
      mine.resize(at + h->output_size());
      if (dev) {
        TestDevice().CopyToHost(mine.data() + at, h->device_output(), h->output_size(), *stream);
      } else {
        std::memcpy(mine.data() + at, h->output().data(), h->output_size());
      }
      for (int64_t d : h->output_shape()) mine.push_back(static_cast<char>(d));
    };
    const auto& model = Model();
    for (int step = 0; step < 2; ++step) {
      const Tensor& bias = model[1];  // 64 float32 rows, fewer on higher ranks
      keep_output(rt.Allgather("gather", bias.dtype, {64 - me}, input(bias, 64 - me, step), nullptr, placement), "allgather");
      const Tensor& fc1 = model[2];  // {512, 300}: uneven splits
      std::vector<int64_t> splits(static_cast<size_t>(n), 512 / n);
      splits[0] += 512 % n - 1;
      splits.back() += 1;
      keep_output(rt.Alltoall("a2a", fc1.dtype, fc1.shape, input(fc1, 512, step), splits, placement), "alltoall");
      keep_output(rt.Reducescatter("rs32", fc1.dtype, fc1.shape, input(fc1, 512, step), ReduceOp::kAverage, 0.5, 3.0,
                                   nullptr, placement),
                  "reducescatter float32");
      const Tensor& fc2 = model[4];  // float16 {100, 512}
      keep_output(rt.Reducescatter("rs16", fc2.dtype, fc2.shape, input(fc2, 100, step), ReduceOp::kSum, 1.0, 1.0,
                                   nullptr, placement),
                  "reducescatter float16");
    }
    for (const auto& [d, bytes] : allocated) TestDevice().Free(d, bytes);
    return std::string();
  });
  EXPECT_EQ(Failures(failures), "");
  return results;
}

TEST(RuntimeOnDevice, AllgatherAlltoallReducescatterOutputsOnTheDeviceHaveTheHostBytes) {
  for (int world : {2, 3}) {
    const Results host = Gather(world, Where::kHost, false);
    const Results staged = Gather(world, Where::kDevice, false);
    const size_t before = DeviceMemoryCommunicatorBytes();
    const Results direct = Gather(world, Where::kDevice, true);
    EXPECT_GT(DeviceMemoryCommunicatorBytes(), before) << "the device communicators were not used";
    for (int r = 0; r < world; ++r) {
      ASSERT_FALSE(host[static_cast<size_t>(r)].empty());
      EXPECT_TRUE(staged[static_cast<size_t>(r)] == host[static_cast<size_t>(r)])
          << "staged, world " << world << " rank " << r;
      EXPECT_TRUE(direct[static_cast<size_t>(r)] == host[static_cast<size_t>(r)])
          << "device communicators, world " << world << " rank " << r;
    }
  }
}

TEST(RuntimeOnDevice, GroupedPlacementsMustBeNoneOneOrOnePerTensor) {
  const std::vector<std::string> results = RunRanks(1, [&](Communicator& comm) {
    Runtime rt(OptionsFor(comm));
    float a = 1, b = 2, c = 3;
    try {
      rt.GroupedAllreduce({"a", "b", "c"}, DataType::kFloat32, {{1}, {1}, {1}}, {&a, &b, &c}, {&a, &b, &c},
                          ReduceOp::kSum, 1, 1, nullptr, {Placement{}, Placement{}});
      return std::string("no error");
    } catch (const InvalidArgument& e) {
      const std::string want = "grouped allreduce needs no placement, one, or one per name (got 2 for 3 names)";
      return std::string(e.what()).find(want) == std::string::npos ? std::string(e.what()) : std::string();
    }
  });
  EXPECT_EQ(Failures(results), "");
}

TEST(RuntimeOnDevice, AHostOutputBufferForADeviceTensorIsRefusedByName) {
  const std::vector<std::string> results = RunRanks(1, [&](Communicator& comm) {
    Runtime rt(OptionsFor(comm));
    Device& dev = TestDevice();
    std::unique_ptr<Stream> stream = dev.NewStream();
    const Placement placement{&dev, stream.get()};
    void* in = dev.Allocate(64 * sizeof(float));
    std::vector<float> out(64);
    const OutputBuffer into{out.data(), out.size() * sizeof(float)};
    std::string wrong;
    for (const bool gather : {true, false}) {
      try {
        if (gather) {
          rt.Allgather("g", DataType::kFloat32, {64}, in, nullptr, placement, into);
        } else {
          rt.Reducescatter("r", DataType::kFloat32, {64}, in, ReduceOp::kSum, 1, 1, nullptr, placement, into);
        }
        wrong += gather ? "allgather: no error; " : "reducescatter: no error; ";
      } catch (const InvalidArgument& e) {
        const std::string want = std::string(gather ? "allgather of 'g'" : "reducescatter of 'r'") +
                                 ": the output buffer given is host memory, and the tensor is on a device";
        if (std::string(e.what()).find(want) == std::string::npos) wrong += std::string(e.what()) + "; ";
      }
    }
    dev.Free(in, 64 * sizeof(float));
    return wrong;
  });
  EXPECT_EQ(Failures(results), "");
}

}  // namespace
}  // namespace gradcomp
