// The emulated CUDA runtime's engine (cuda_emulation.cc), for the emulated NCCL
// (nccl_emulation.cc), whose operations are stream work that waits for its peers: not for the
// code under test, which sees only cuda_runtime.h and nccl.h.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "test/support/cuda_emulation/cuda_runtime.h"

namespace gc_cuda_emulation {

/// Holds the engine's lock for its lifetime (recursive). The engine's state is under it, and so
/// is the emulated NCCL's.
class EngineLock {
 public:
  EngineLock();
  ~EngineLock();
  EngineLock(const EngineLock&) = delete;
  EngineLock& operator=(const EngineLock&) = delete;
};

/// With the engine's lock held: releases it until another thread changes the engine's state
/// (Notify) or a second has passed, then takes it again as many times as it was held. Stream work
/// that waits for other threads' work (a collective waiting for its peers) waits so: meanwhile
/// the other threads run their own streams.
void WaitForChange();
/// Wakes the threads in WaitForChange: the state they wait on may have changed.
void Notify();

/// Enqueues `run` on `stream` as work that runs, with the engine's lock held and the device
/// memory `touches` names open, when the host synchronizes with the stream. An error for a
/// stream the engine does not know, or when the context is poisoned.
cudaError_t EnqueueWork(cudaStream_t stream, std::function<void()> run, std::vector<const void*> touches);

/// The device holding the device memory [p, p + bytes) (one allocation), or -1 for any other.
int DeviceOf(const void* p, size_t bytes);
/// What [p, p + bytes) is, for messages: "pageable host memory", "page-locked host memory", or
/// where it lies in or past a device allocation.
std::string DescribeMemory(const void* p, size_t bytes);
/// The device a stream (null: the calling thread's current device's legacy stream) belongs to, or
/// -1 for a stream the engine does not know.
int DeviceOfStream(cudaStream_t stream);

/// Prints `what` as the emulation's and aborts.
[[noreturn]] void Fatal(const std::string& what);

}  // namespace gc_cuda_emulation
