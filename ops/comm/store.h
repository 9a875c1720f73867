// A key-value store every rank of a job reaches (torch.distributed's TCPStore under torchrun and
// every env:// launcher): what a world without MPI is bootstrapped through
// (ops/comm/store_communicator.h). Implementations: torch's store seen from Python
// (frameworks/python/store_bindings.cc) and a store in memory for thread ranks (tests).
#pragma once

#include <optional>
#include <string>

namespace gradcomp {

class Store {
 public:
  virtual ~Store() = default;
  /// Sets `key` to `value` (bytes), for every rank to read.
  virtual void Set(const std::string& key, const std::string& value) = 0;
  /// `key`'s value once some rank has set it, waiting at most `timeout_seconds` (0: only looks);
  /// nullopt when it still is not set then. Throws gradcomp::Error when the store fails.
  virtual std::optional<std::string> Get(const std::string& key, double timeout_seconds) = 0;
};

}  // namespace gradcomp
