// The device layer (ops/device): every kernel of the host device and of the separate-memory
// test device writes the bytes of the CPU functions it stands for; the separate-memory device
// faults on host access to its buffers and rejects pointers of the wrong space; its allocator
// reuses and coalesces; Scratch allocates only when it grows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/common/enforce.h"
#include "ops/compression/codec_on_device.h"
#include "ops/device/staging.h"
#include "ops/compression/memory.h"
#include "ops/device/device.h"
#if GRADCOMP_TEST_CUDA_DEVICE
#include "ops/device/cuda_device.h"
#endif
#include "ops/reduce/reduce.h"
#include "test/support/reference.h"

namespace gradcomp {
namespace {

using testing::AllDataTypes;
using testing::MakeInput;

constexpr size_t kCapacity = size_t{1} << 30;

std::vector<float> Gaussian(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// Host bytes staged on `dev` and read back: a round trip through its memory.
class OnDevice {
 public:
  OnDevice(Device& dev, Stream& s, const void* host, size_t bytes) : dev_(dev), s_(s), bytes_(bytes) {
    ptr_ = dev.Allocate(bytes);
    if (host != nullptr) dev.CopyFromHost(ptr_, host, bytes, s);
  }
  ~OnDevice() { dev_.Free(ptr_, bytes_); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  void* ptr() const { return ptr_; }
  std::vector<char> Read() const {
    std::vector<char> out(bytes_);
    dev_.CopyToHost(out.data(), ptr_, bytes_, s_);
    s_.Synchronize();
    return out;
  }

 private:
  Device& dev_;
  Stream& s_;
  size_t bytes_;
  void* ptr_;
};

std::vector<char> Bytes(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  return std::vector<char>(c, c + n);
}

enum class Kind { kHost, kSeparate, kCuda };

class DeviceKernels : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    if (GetParam() == Kind::kSeparate) {
      owned_ = NewSeparateMemoryDevice(kCapacity);
      dev_ = owned_.get();
    } else if (GetParam() == Kind::kCuda) {
#if GRADCOMP_TEST_CUDA_DEVICE
      dev_ = &CudaDevice(0);
#endif
    } else {
      dev_ = &HostDevice();
    }
    ASSERT_NE(dev_, nullptr);
    stream_ = dev_->NewStream();
  }
  Device& dev() { return *dev_; }
  Stream& stream() { return *stream_; }
  /// The CUDA device's arithmetic takes float32, float16 and bfloat16 only (cuda_device.h).
  bool cuda() const { return GetParam() == Kind::kCuda; }

 private:
  std::unique_ptr<Device> owned_;
  Device* dev_ = nullptr;
  std::unique_ptr<Stream> stream_;
};

TEST_P(DeviceKernels, CodecsWriteTheCpuBytes) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{4097}, size_t{100000}}) {
    const std::vector<float> x = Gaussian(n, 11);
    for (const Codec* codec : AllCodecs()) {
      CodecParams p;
      p.bits = 3;
      p.bucket_size = 128;
      p.stochastic = true;
      p.seed = 5;
      p.step = 2;
      p.topk_ratio = 0.05;
      const size_t max_bytes = codec->MaxWireSize(n, p);
      std::vector<uint8_t> want(max_bytes);
      const size_t want_bytes = codec->Encode(x.data(), DataType::kFloat32, n, p, 3, want.data());
      OnDevice in(dev(), stream(), x.data(), n * sizeof(float));
      OnDevice wire(dev(), stream(), nullptr, max_bytes);
      const size_t got_bytes = EncodeOn(dev(), *codec, in.ptr(), DataType::kFloat32, n, p, 3, wire.ptr(), stream());
      ASSERT_EQ(got_bytes, want_bytes) << codec->name() << " n=" << n;
      EXPECT_EQ(Bytes(wire.Read().data(), got_bytes), Bytes(want.data(), want_bytes)) << codec->name() << " n=" << n;
      // Decode, then decode-accumulate onto it: twice the decoded values.
      std::vector<float> decoded(n);
      codec->Decode(want.data(), want_bytes, n, p, DataType::kFloat32, decoded.data());
      std::vector<float> twice = decoded;
      codec->DecodeAccumulate(want.data(), want_bytes, n, p, DataType::kFloat32, twice.data());
      OnDevice out(dev(), stream(), nullptr, n * sizeof(float));
      DecodeOn(dev(), *codec, wire.ptr(), got_bytes, n, p, DataType::kFloat32, out.ptr(), false, stream());
      EXPECT_EQ(out.Read(), Bytes(decoded.data(), n * sizeof(float))) << codec->name();
      DecodeOn(dev(), *codec, wire.ptr(), got_bytes, n, p, DataType::kFloat32, out.ptr(), true, stream());
      EXPECT_EQ(out.Read(), Bytes(twice.data(), n * sizeof(float))) << codec->name();
    }
  }
}

// The registry names every codec's kernels for the device's kind (ops/compression/codec.cc): a
// build that left some out (the CUDA ones are weak references) fails here by name. A GPU's memory
// has no host address to run the CPU's kernels on.
TEST_P(DeviceKernels, EveryCodecHasKernelsForTheDevicesKind) {
  for (const Codec* codec : AllCodecs()) {
    EXPECT_NE(CodecKernelsOn(*codec, dev().kind()), nullptr) << codec->name() << " on " << dev().name();
  }
  OnDevice buffer(dev(), stream(), nullptr, 64);
  if (dev().kind() == DeviceKind::kCuda) {
    try {
      dev().HostAddress(buffer.ptr(), 64, "a buffer");
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgument& e) {
      const std::string want = std::string(dev().name()) + ": a buffer is GPU memory, which the CPU cannot address";
      EXPECT_EQ(std::string(e.what()), want);
    }
  } else {
    EXPECT_NE(dev().HostAddress(buffer.ptr(), 64, "a buffer"), nullptr);
  }
}

TEST_P(DeviceKernels, ArithmeticWritesTheCpuBytes) {
  const size_t n = 1003;
  for (DataType dt : AllDataTypes()) {
    const std::vector<char> a = MakeInput(dt, ReduceOp::kSum, n, 0), b = MakeInput(dt, ReduceOp::kSum, n, 1);
    const size_t bytes = a.size();
    OnDevice da(dev(), stream(), a.data(), bytes), db(dev(), stream(), b.data(), bytes);
    if (cuda() && !IsCodecDataType(dt)) {
      EXPECT_THROW(dev().Reduce(da.ptr(), da.ptr(), db.ptr(), n, dt, ReduceOp::kSum, stream()), InvalidArgument);
      continue;
    }
    std::vector<char> want(bytes);
    ReduceTwo(want.data(), a.data(), b.data(), n, dt, ReduceOp::kSum);
    dev().Reduce(da.ptr(), da.ptr(), db.ptr(), n, dt, ReduceOp::kSum, stream());
    EXPECT_EQ(da.Read(), want) << DataTypeName(dt);
    if (dt == DataType::kBool) continue;
    ScaleInPlace(want.data(), n, dt, 0.37);
    dev().Scale(da.ptr(), n, dt, 0.37, stream());
    EXPECT_EQ(da.Read(), want) << DataTypeName(dt);
    FinishReduction(want.data(), n, dt, ReduceOp::kAverage, 2.0, 3);
    dev().FinishReduction(da.ptr(), n, dt, ReduceOp::kAverage, 2.0, 3, stream());
    EXPECT_EQ(da.Read(), want) << DataTypeName(dt);
  }
  const std::vector<float> x = Gaussian(n, 3), y = Gaussian(n, 4);
  for (DataType to : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32}) {
    std::vector<char> want(n * DataTypeSize(to));
    CastBuffer(x.data(), DataType::kFloat32, n, want.data(), to, false);
    CastBuffer(y.data(), DataType::kFloat32, n, want.data(), to, true);
    OnDevice dx(dev(), stream(), x.data(), n * 4), dy(dev(), stream(), y.data(), n * 4);
    OnDevice out(dev(), stream(), nullptr, want.size());
    dev().Cast(dx.ptr(), DataType::kFloat32, n, out.ptr(), to, false, stream());
    dev().Cast(dy.ptr(), DataType::kFloat32, n, out.ptr(), to, true, stream());
    EXPECT_EQ(out.Read(), want) << DataTypeName(to);
  }
  OnDevice dx(dev(), stream(), x.data(), n * 4), dy(dev(), stream(), y.data(), n * 4);
  OnDevice diff(dev(), stream(), nullptr, n * 4);
  dev().Subtract(static_cast<float*>(diff.ptr()), static_cast<const float*>(dx.ptr()),
                 static_cast<const float*>(dy.ptr()), n, stream());
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = x[i] - y[i];
  EXPECT_EQ(diff.Read(), Bytes(want.data(), n * 4));
  EXPECT_TRUE(dev().AllFinite(static_cast<const float*>(diff.ptr()), n, stream()));
  const float inf = std::numeric_limits<float>::infinity();
  dev().CopyFromHost(static_cast<char*>(diff.ptr()) + 4 * 500, &inf, 4, stream());
  EXPECT_FALSE(dev().AllFinite(static_cast<const float*>(diff.ptr()), n, stream()));
  // Copies and fills on the device.
  dev().Copy(diff.ptr(), dx.ptr(), n * 4, stream());
  EXPECT_EQ(diff.Read(), Bytes(x.data(), n * 4));
  dev().Fill(diff.ptr(), 0, n * 4, stream());
  EXPECT_EQ(diff.Read(), std::vector<char>(n * 4, 0));
  auto event = dev().NewEvent();
  event->Record(stream());
  event->Synchronize();
  EXPECT_TRUE(event->Query());
}

TEST_P(DeviceKernels, DgcAndMaskingWriteTheCpuBytes) {
  const size_t n = 5003;
  for (bool nesterov : {false, true}) {
    std::vector<float> u = Gaussian(n, 21), v = Gaussian(n, 22), g = Gaussian(n, 23);
    OnDevice du(dev(), stream(), u.data(), n * 4), dv(dev(), stream(), v.data(), n * 4),
        dg(dev(), stream(), g.data(), n * 4);
    DgcAccumulate(u.data(), v.data(), g.data(), n, 0.9f, nesterov);
    dev().DgcAccumulate(static_cast<float*>(du.ptr()), static_cast<float*>(dv.ptr()), static_cast<float*>(dg.ptr()),
                        n, 0.9f, nesterov, stream());
    EXPECT_EQ(du.Read(), Bytes(u.data(), n * 4));
    EXPECT_EQ(dv.Read(), Bytes(v.data(), n * 4));
    EXPECT_EQ(dg.Read(), Bytes(g.data(), n * 4));
    const std::vector<uint32_t> sent = {0, 17, 4000, static_cast<uint32_t>(n - 1)};
    for (uint32_t i : sent) u[i] = 0.0f;
    dev().ZeroAt(static_cast<float*>(du.ptr()), n, sent.data(), sent.size(), stream());
    EXPECT_EQ(du.Read(), Bytes(u.data(), n * 4));
    const uint32_t outside = static_cast<uint32_t>(n);
    try {
      dev().ZeroAt(static_cast<float*>(du.ptr()), n, &outside, 1, stream());
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ZeroAt: index 5003 outside 5003 values"), std::string::npos) << e.what();
    }
  }
}

#if GRADCOMP_TEST_CUDA_DEVICE
INSTANTIATE_TEST_SUITE_P(Cuda, DeviceKernels, ::testing::Values(Kind::kCuda),
                         [](const ::testing::TestParamInfo<Kind>&) { return std::string("cuda"); });
#else
INSTANTIATE_TEST_SUITE_P(HostAndSeparateMemory, DeviceKernels, ::testing::Values(Kind::kHost, Kind::kSeparate),
                         [](const ::testing::TestParamInfo<Kind>& p) {
                           return std::string(p.param == Kind::kSeparate ? "separate" : "host");
                         });
#endif

TEST(SeparateMemoryDevice, HostCodeThatTouchesItsBuffersFaults) {
  auto dev = NewSeparateMemoryDevice(kCapacity);
  EXPECT_EQ(dev->space(), MemorySpace::kDevice);
  EXPECT_EQ(HostDevice().space(), MemorySpace::kHost);
  auto* p = static_cast<volatile float*>(dev->Allocate(64));
  EXPECT_DEATH({ p[3] = 1.0f; }, "");
  EXPECT_DEATH({ std::printf("%f\n", static_cast<double>(p[0])); }, "");
  dev->Free(const_cast<float*>(p), 64);
}

TEST(SeparateMemoryDevice, RejectsPointersOfTheWrongSpaceNamingTheCall) {
  auto dev = NewSeparateMemoryDevice(kCapacity);
  auto s = dev->NewStream();
  std::vector<float> host(16, 1.0f);
  void* d = dev->Allocate(host.size() * 4);
  const auto expect_error = [](const std::function<void()>& call, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "no error; wanted: " << text;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error([&] { dev->Scale(host.data(), 16, DataType::kFloat32, 2.0, *s); }, "Scale buffer ");
  expect_error([&] { dev->Scale(host.data(), 16, DataType::kFloat32, 2.0, *s); },
               "is not this device's memory: a host buffer was passed where a device buffer belongs");
  expect_error([&] { dev->CopyToHost(d, d, 64, *s); }, "CopyToHost destination");
  expect_error([&] { dev->CopyFromHost(d, d, 64, *s); }, "a device buffer was passed where host memory belongs");
  expect_error([&] { dev->CopyFromHost(host.data(), host.data(), 64, *s); }, "CopyFromHost destination");
  // A range that runs past the end of the device's memory is not its memory either.
  expect_error([&] { dev->Fill(static_cast<char*>(d) + 16, 0, kCapacity, *s); }, "Fill destination");
  dev->Free(d, 64);
}

TEST(SeparateMemoryDevice, FreedMemoryIsReusedAndCoalesced) {
  auto dev = NewSeparateMemoryDevice(size_t{1} << 20);
  void* a = dev->Allocate(300 << 10);
  void* b = dev->Allocate(300 << 10);
  void* c = dev->Allocate(300 << 10);
  try {  // 4 x 300 KiB do not fit in 1 MiB
    dev->Allocate(300 << 10);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("separate-memory device: 307200 bytes do not fit in what is left of its "
                                         "1048576 bytes"),
              std::string::npos)
        << e.what();
  }
  dev->Free(b, 300 << 10);
  void* b2 = dev->Allocate(100 << 10);
  EXPECT_EQ(b2, b);  // first fit: the hole b left
  dev->Free(b2, 100 << 10);
  dev->Free(a, 300 << 10);
  dev->Free(c, 300 << 10);
  // Everything merged back: the whole capacity is one block again.
  void* all = dev->Allocate(size_t{1} << 20);
  EXPECT_EQ(all, a);
  dev->Free(all, size_t{1} << 20);
}

TEST(Scratch, AllocatesOnlyWhenItGrowsAndCountsOnTheDevice) {
  std::unique_ptr<Device> dev = NewSeparateMemoryDevice(kCapacity);
  Scratch a, b;
  const uint64_t before = dev->allocations();
  for (int step = 0; step < 20; ++step) {
    // Sizes that wobble below what was reserved first, then one step that needs more.
    const size_t bytes = (size_t{1} << 20) - static_cast<size_t>(step % 5) * 100 + (step == 10 ? 4096 : 0);
    void* p = a.Reserve(*dev, bytes);
    ASSERT_GE(a.capacity(), bytes);
    dev->Fill(p, 0, bytes, *dev->NewStream());  // usable device memory
    b.Reserve(*dev, 100, true);                   // host staging of the same device
  }
  // a: the first size, then grown once by half at step 10; b: once.
  EXPECT_EQ(dev->allocations() - before, 3u);
  EXPECT_GE(a.capacity(), (size_t{1} << 20) * 3 / 2);
}

}  // namespace
}  // namespace gradcomp
