// Runs the data path once on the host and once more through the separate-memory device
// (ops/device/device.h), and insists on the same bytes: the CI proof that the device-agnostic
// path makes every copy it needs and touches no device buffer from the host, without a GPU.
#pragma once

#include <functional>

#include "ops/collectives/compressed_allreduce.h"
#include "ops/device/device.h"

namespace gradcomp::testing {

/// The separate-memory device the tests of a process share (thread-safe).
Device& TestDevice();

/// Runs the compressed collective `run` on the host with copies of o's buffers, then with every
/// buffer (input, output, residuals) copied to TestDevice() and a workspace there; throws
/// gradcomp::Error naming what differs unless both runs give the same bytes (output,
/// residuals, indices sent). o's own buffers end as both runs left them.
void OnHostAndDevice(const CompressedAllreduceOptions& o,
                     const std::function<void(const CompressedAllreduceOptions&)>& run);

}  // namespace gradcomp::testing
