// Runs the data path once on the host and once more through the separate-memory device
// (ops/device/device.h), and insists on the same bytes: the CI proof that the device-agnostic
// path makes every copy it needs and touches no device buffer from the host, without a GPU.
#pragma once

#include <functional>

#include "ops/collectives/compressed_allreduce.h"
#include "ops/device/device.h"

namespace gradcomp::testing {

/// The separate-memory device the tests of a process share (thread-safe); CUDA device 0 where
/// the support library is built with GRADCOMP_TEST_CUDA_DEVICE (the emulated CUDA tests).
Device& TestDevice();

/// Runs a compressed collective three times: `run(options, false)` on the host with copies of
/// o's buffers; then with every buffer (input, output, residuals) copied to TestDevice() and a
/// workspace there, `run(options, false)` (the communicator staged through the host) and
/// `run(options, true)`, where run must hand the collective communicators that take device
/// memory (DeviceMemoryCommunicator, test/support/device_comm.h). Throws gradcomp::Error naming
/// what differs unless every run gives the host's bytes (output, residuals, indices sent). o's
/// own buffers end as the runs left them.
void OnHostAndDevice(const CompressedAllreduceOptions& o,
                     const std::function<void(const CompressedAllreduceOptions&, bool device_comm)>& run);
/// The same for a collective whose input holds `in_count` values and output `out_count` (the
/// sharded ones: compressed_shards.h); residuals hold o.count floats.
void OnHostAndDevice(const CompressedAllreduceOptions& o, size_t in_count, size_t out_count,
                     const std::function<void(const CompressedAllreduceOptions&, bool device_comm)>& run);

}  // namespace gradcomp::testing
