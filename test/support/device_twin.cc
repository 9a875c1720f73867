#include "test/support/device_twin.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ops/common/enforce.h"

namespace gradcomp::testing {

namespace {

// Host bytes copied into TestDevice() memory, and read back.
class DeviceCopy {
 public:
  DeviceCopy(const void* host, size_t bytes) : bytes_(bytes) {
    ptr_ = TestDevice().Allocate(bytes);
    TestDevice().CopyFromHost(ptr_, host, bytes, Stream());
  }
  ~DeviceCopy() { TestDevice().Free(ptr_, bytes_); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  void* ptr() const { return ptr_; }
  std::vector<char> Read() const {
    std::vector<char> out(bytes_);
    TestDevice().CopyToHost(out.data(), ptr_, bytes_, Stream());
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
  const char* c = static_cast<const char*>(p);
  return p == nullptr ? std::vector<char>() : std::vector<char>(c, c + n);
}

void Expect(bool same, const char* what, const CompressedAllreduceOptions& o) {
  if (!same) {
    GC_THROW("the separate-memory device run's ", what, " differs from the host run's (tensor '", o.name, "', ",
             o.count, " values, codec ", o.codec->name(), ")");
  }
}

}  // namespace

Device& TestDevice() {
  static const std::unique_ptr<Device> device = NewSeparateMemoryDevice();
  return *device;
}

void OnHostAndDevice(const CompressedAllreduceOptions& o,
                     const std::function<void(const CompressedAllreduceOptions&)>& run) {
  const size_t bytes = o.count * DataTypeSize(o.dtype), floats = o.count * sizeof(float);
  const bool in_place = o.input == o.output;
  const std::vector<char> input = HostBytes(o.input, bytes), output = HostBytes(o.output, bytes);
  const std::vector<char> residual = HostBytes(o.residual, floats), reduced = HostBytes(o.reduced_residual, floats);

  // The host run, on copies.
  std::vector<char> h_in = input, h_out = output, h_res = residual, h_red = reduced;
  std::vector<uint32_t> h_sent;
  CompressedAllreduceOptions h = o;
  h.device = nullptr;
  h.workspace = nullptr;
  h.input = h_in.data();
  h.output = in_place ? h_in.data() : h_out.data();
  if (o.residual) h.residual = reinterpret_cast<float*>(h_res.data());
  if (o.reduced_residual) h.reduced_residual = reinterpret_cast<float*>(h_red.data());
  if (o.sent_indices) h.sent_indices = &h_sent;
  run(h);

  // The device run, with a workspace kept across calls as the runtime keeps one.
  thread_local std::unique_ptr<CompressionWorkspace> ws;
  if (!ws) ws = std::make_unique<CompressionWorkspace>(TestDevice());
  DeviceCopy d_in(input.data(), bytes), d_out(output.data(), bytes);
  DeviceCopy d_res(residual.data(), residual.size()), d_red(reduced.data(), reduced.size());
  CompressedAllreduceOptions d = o;
  d.device = &TestDevice();
  d.workspace = ws.get();
  d.input = d_in.ptr();
  d.output = in_place ? d_in.ptr() : d_out.ptr();
  d.residual = o.residual ? static_cast<float*>(d_res.ptr()) : nullptr;
  d.reduced_residual = o.reduced_residual ? static_cast<float*>(d_red.ptr()) : nullptr;
  run(d);

  const std::vector<char> got = (in_place ? d_in : d_out).Read();
  Expect(got == (in_place ? h_in : h_out), "output", o);
  if (bytes > 0) std::memcpy(o.output, got.data(), bytes);
  if (o.residual) {
    const std::vector<char> r = d_res.Read();
    Expect(r == h_res, "residual", o);
    std::memcpy(o.residual, r.data(), floats);
  }
  if (o.reduced_residual) {
    const std::vector<char> r = d_red.Read();
    Expect(r == h_red, "reduced residual", o);
    std::memcpy(o.reduced_residual, r.data(), floats);
  }
  if (o.sent_indices) Expect(*o.sent_indices == h_sent, "indices sent", o);
}

}  // namespace gradcomp::testing
