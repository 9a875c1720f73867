#include "test/support/device_twin.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ops/common/enforce.h"
#if GRADCOMP_TEST_CUDA_DEVICE
#include "ops/device/cuda_device.h"
#endif

namespace gradcomp::testing {

namespace {

// Host bytes copied into TestDevice() memory, and read back.
class DeviceCopy {
 public:
  DeviceCopy(const void* host, size_t bytes) : bytes_(bytes) {
    ptr_ = TestDevice().Allocate(bytes);
    TestDevice().CopyFromHost(ptr_, host, bytes, Stream());
    Stream().Synchronize();  // the collective runs on streams of its own
  }
  ~DeviceCopy() { TestDevice().Free(ptr_, bytes_); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  void* ptr() const { return ptr_; }
  std::vector<char> Read() const {
    std::vector<char> out(bytes_);
    TestDevice().CopyToHost(out.data(), ptr_, bytes_, Stream());
    Stream().Synchronize();
    return out;
  }

 private:
  static gradcomp::Stream& Stream() {
    thread_local std::unique_ptr<gradcomp::Stream> s = TestDevice().NewStream();
    return *s;
  }
  size_t bytes_;
  void* ptr_;
};

std::vector<char> HostBytes(const void* p, size_t n) {
  std::vector<char> out(p == nullptr ? 0 : n);
  if (!out.empty()) std::memcpy(out.data(), p, out.size());
  return out;
}

}  // namespace

Device& TestDevice() {
#if GRADCOMP_TEST_CUDA_DEVICE
  return CudaDevice(0);  // a GPU's, or the emulated CUDA runtime's (test/CMakeLists.txt)
#else
  static const std::unique_ptr<Device> device = NewSeparateMemoryDevice();
  return *device;
#endif
}

namespace {

// What one run left: output, residuals, indices sent.
struct Outcome {
  std::vector<char> output, residual, reduced;
  std::vector<uint32_t> sent;
};

void Expect(const Outcome& got, const Outcome& want, const char* how, const CompressedAllreduceOptions& o) {
  const auto check = [&](bool same, const char* what) {
    if (!same) {
      GC_THROW("the ", TestDevice().name(), " device run (", how, ")'s ", what,
               " differs from the host run's (tensor '", o.name, "', ", o.count, " values, codec ", o.codec->name(),
               ")");
    }
  };
  check(got.output == want.output, "output");
  check(got.residual == want.residual, "residual");
  check(got.reduced == want.reduced, "reduced residual");
  check(got.sent == want.sent, "indices sent");
}

// One run on the device, from the host bytes of the buffers.
Outcome DeviceRun(const CompressedAllreduceOptions& o, const std::vector<char>& input, const std::vector<char>& output,
                  const std::vector<char>& residual, const std::vector<char>& reduced, bool device_comm,
                  const std::function<void(const CompressedAllreduceOptions&, bool)>& run) {
  // A workspace kept across calls, as the runtime keeps one.
  thread_local std::unique_ptr<CompressionWorkspace> ws;
  if (!ws) ws = std::make_unique<CompressionWorkspace>(TestDevice());
  const bool in_place = o.input == o.output;
  DeviceCopy d_in(input.data(), input.size()), d_out(output.data(), output.size());
  DeviceCopy d_res(residual.data(), residual.size()), d_red(reduced.data(), reduced.size());
  Outcome r;
  CompressedAllreduceOptions d = o;
  d.device = &TestDevice();
  d.workspace = ws.get();
  d.input = d_in.ptr();
  d.output = in_place ? d_in.ptr() : d_out.ptr();
  d.residual = o.residual ? static_cast<float*>(d_res.ptr()) : nullptr;
  d.reduced_residual = o.reduced_residual ? static_cast<float*>(d_red.ptr()) : nullptr;
  d.sent_indices = o.sent_indices ? &r.sent : nullptr;
  run(d, device_comm);
  r.output = (in_place ? d_in : d_out).Read();
  if (o.residual) r.residual = d_res.Read();
  if (o.reduced_residual) r.reduced = d_red.Read();
  return r;
}

}  // namespace

void OnHostAndDevice(const CompressedAllreduceOptions& o,
                     const std::function<void(const CompressedAllreduceOptions&, bool device_comm)>& run) {
  OnHostAndDevice(o, o.count, o.count, run);
}

void OnHostAndDevice(const CompressedAllreduceOptions& o, size_t in_count, size_t out_count,
                     const std::function<void(const CompressedAllreduceOptions&, bool device_comm)>& run) {
  const size_t bytes = out_count * DataTypeSize(o.dtype), floats = o.count * sizeof(float);
  const bool in_place = o.input == o.output;
  const std::vector<char> input = HostBytes(o.input, in_count * DataTypeSize(o.dtype)), output = HostBytes(o.output, bytes);
  const std::vector<char> residual = HostBytes(o.residual, floats), reduced = HostBytes(o.reduced_residual, floats);

  // The host run, on copies.
  Outcome host;
  host.residual = residual;
  host.reduced = reduced;
  std::vector<char> h_in = input, h_out = output;
  CompressedAllreduceOptions h = o;
  h.device = nullptr;
  h.workspace = nullptr;
  h.input = h_in.data();
  h.output = in_place ? h_in.data() : h_out.data();
  if (o.residual) h.residual = reinterpret_cast<float*>(host.residual.data());
  if (o.reduced_residual) h.reduced_residual = reinterpret_cast<float*>(host.reduced.data());
  if (o.sent_indices) h.sent_indices = &host.sent;
  run(h, false);
  host.output = in_place ? h_in : h_out;
  if (!o.residual) host.residual.clear();
  if (!o.reduced_residual) host.reduced.clear();

  const Outcome staged = DeviceRun(o, input, output, residual, reduced, false, run);
  Expect(staged, host, "staged through the host", o);
  const Outcome direct = DeviceRun(o, input, output, residual, reduced, true, run);
  Expect(direct, host, "communicators on device memory", o);

  if (bytes > 0) std::memcpy(o.output, direct.output.data(), bytes);
  if (o.residual) std::memcpy(o.residual, direct.residual.data(), floats);
  if (o.reduced_residual) std::memcpy(o.reduced_residual, direct.reduced.data(), floats);
  if (o.sent_indices) *o.sent_indices = direct.sent;
}

}  // namespace gradcomp::testing
