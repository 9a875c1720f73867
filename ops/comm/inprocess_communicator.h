// Ranks as threads of one process (gloo's test style): fast, deterministic multi-rank tests
// with no MPI. Collectives exchange pointers and read peers' buffers directly.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ops/comm/communicator.h"

namespace gradcomp {

class InProcessWorld;

/// Creates `size` communicators sharing one in-process world; hand one to each thread.
std::vector<std::unique_ptr<Communicator>> CreateInProcessWorld(int size);

/// Makes every rank blocked in (or later entering) a call on `comm`'s world throw
/// gradcomp::Error carrying `why`. Used by test harnesses when one rank fails, so the
/// others fail too instead of waiting forever.
void AbortInProcessWorld(Communicator& comm, const std::string& why);

}  // namespace gradcomp
