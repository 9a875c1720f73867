// Where an adapter's buffers are, for the bindings (runtime_bindings.cc, core_module.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/runtime.h"
#include "gradcomp/config.h"
#include "ops/common/enforce.h"
#include "ops/device/device.h"
#if GRADCOMP_HAVE_CUDA_KERNELS
#include "ops/device/cuda_device.h"
#endif

namespace gradcomp {

/// `device` -1 is host memory; a GPU ordinal is that GPU's memory, its input produced on
/// `stream` (the framework's cudaStream_t; 0: the legacy default stream). Keeps the stream
/// wrapper alive for the call; `what` names the operation in errors.
class Where {
 public:
  Where(int device, uintptr_t stream, const std::string& what) {
    if (device < 0) return;
#if GRADCOMP_HAVE_CUDA_KERNELS
    try {
      placement_.device = &CudaDevice(device);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(what + ": " + e.what());
    }
    stream_ = WrapCudaStream(reinterpret_cast<void*>(stream));
    placement_.stream = stream_.get();
#else
    (void)stream;
    throw InvalidArgument(what + ": the tensor is on GPU " + std::to_string(device) +
                          " but this gradcomp was built without CUDA");
#endif
  }
  /// For the runtime: no device for host memory.
  Placement placement() const { return placement_; }
  /// For a direct device call: the host device and a host stream for host memory.
  Device& device() const { return placement_.device != nullptr ? *placement_.device : HostDevice(); }
  Stream& stream() {
    if (placement_.stream != nullptr) return *placement_.stream;
    if (!host_stream_) host_stream_ = HostDevice().NewStream();
    return *host_stream_;
  }

 private:
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Stream> host_stream_;
  Placement placement_;
};

}  // namespace gradcomp
