// A communicator that takes only device memory, for tests: what NCCL or CUDA-aware MPI are to
// the data path, over any communicator and any Device. Every buffer handed to it must be memory
// of its device (the separate-memory device rejects anything else, naming the call); it
// copies the bytes to the host around each operation of the communicator it wraps. With it the
// compressed collectives' device-direct path (no host staging: Communicator::device_memory)
// runs in CI without a GPU.
#pragma once

#include <memory>

#include "ops/comm/communicator.h"
#include "ops/device/device.h"

namespace gradcomp::testing {

/// `inner` (borrowed; it must outlive the result), taking `device`'s memory, with point-to-point
/// transfers (Isend, Irecv) as CUDA-aware MPI, or without them (`nonblocking` false) as NCCL.
std::unique_ptr<Communicator> DeviceMemoryCommunicator(Communicator& inner, Device& device, bool nonblocking = true);
/// Bytes moved through every such communicator of the process so far (tests check that a
/// path really used one).
size_t DeviceMemoryCommunicatorBytes();

}  // namespace gradcomp::testing
