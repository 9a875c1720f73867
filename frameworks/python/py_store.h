// A store of Python's (gradcomp.world.StoreAdapter over torch.distributed's TCPStore, or a
// c10d group's store) seen from C++ (ops/comm/store.h): the bootstrap of a world without MPI.
// Called from a thread that released the GIL; each call takes it.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>
#include <string>
#include <utility>

#include "ops/comm/store.h"
#include "ops/common/enforce.h"

namespace gradcomp {

/// `store` has set(key, value: bytes) and get(key, timeout_seconds) -> bytes or None.
class PyStore final : public Store {
 public:
  explicit PyStore(pybind11::object store) : store_(std::move(store)) {}
  ~PyStore() override {
    pybind11::gil_scoped_acquire gil;
    store_ = pybind11::object();
  }
  PyStore(const PyStore&) = delete;
  PyStore& operator=(const PyStore&) = delete;

  void Set(const std::string& key, const std::string& value) override {
    pybind11::gil_scoped_acquire gil;
    try {
      store_.attr("set")(key, pybind11::bytes(value));
    } catch (pybind11::error_already_set& e) {
      throw Error("the store failed to set '" + key + "': " + e.what());
    }
  }

  std::optional<std::string> Get(const std::string& key, double timeout_seconds) override {
    pybind11::gil_scoped_acquire gil;
    try {
      pybind11::object value = store_.attr("get")(key, timeout_seconds);
      if (value.is_none()) return std::nullopt;
      return std::string(pybind11::bytes(value));
    } catch (pybind11::error_already_set& e) {
      throw Error("the store failed to get '" + key + "': " + e.what());
    }
  }

 private:
  pybind11::object store_;
};

}  // namespace gradcomp
