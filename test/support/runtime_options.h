// A runtime for a thread rank of the harness: its settings from `vars` (GRADCOMP_* names) and
// a world of its own split from the rank's communicator.
#pragma once

#include <map>
#include <string>

#include "core/runtime.h"

namespace gradcomp::testing {

inline RuntimeOptions Options(Communicator& comm, const std::map<std::string, std::string>& vars) {
  RuntimeOptions o;
  o.settings = Settings::FromMap(vars);
  o.world = comm.Split(0, comm.rank());
  return o;
}

}  // namespace gradcomp::testing
