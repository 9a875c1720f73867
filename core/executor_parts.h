// What the executor's files (core/executor*.cc) share: small helpers on responses and entries.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "core/executor.h"
#include "ops/collectives/reduction_options.h"
#include "ops/common/shape.h"

namespace gradcomp {

inline int64_t RowElements(const std::vector<int64_t>& shape) {
  return shape.empty() ? 1 : NumElements(std::vector<int64_t>(shape.begin() + 1, shape.end()));
}

// Args of a tensor's end event: dtype, shape, bytes in, bytes on the wire, ratio.
inline std::string EndArgs(DataType dtype, const std::vector<int64_t>& shape, int64_t wire_bytes) {
  const int64_t bytes = NumElements(shape) * static_cast<int64_t>(DataTypeSize(dtype));
  std::ostringstream os;
  os << "\"dtype\": \"" << DataTypeName(dtype) << "\", \"shape\": " << ShapeString(shape) << ", \"bytes\": " << bytes
     << ", \"wire_bytes\": " << wire_bytes << ", \"ratio\": " << (wire_bytes > 0 ? double(bytes) / wire_bytes : 1.0);
  return os.str();
}

// "w3", or "fusion of 12 tensors starting with 'w3'" (error messages, logs).
inline std::string FusedName(const Response& r) {
  const size_t n = r.names.size();
  return n == 1 ? r.names[0] : "fusion of " + std::to_string(n) + " tensors starting with '" + r.names[0] + "'";
}

// The response's reduction into `o`: dtype, op, scale factors, and its name for messages
// (FusedName); the buffers and counts are the caller's.
inline void DescribeReduction(const Response& r, ReductionOptions& o) {
  o.dtype = r.dtype;
  o.op = r.op;
  o.prescale = r.prescale;
  o.postscale = r.postscale;
  o.name = FusedName(r);
}

// The collective `run` on a copy of its options `o` with the buffers RunIntoDeviceOutput hands
// it (`in`, `out`: the device's, or host staging).
template <typename Options>
auto OnBuffers(const Options& o, void (*run)(Communicator&, const Options&)) {
  return [&o, run](Communicator& comm, const void* in, void* out) {
    Options d = o;
    d.input = in;
    d.output = out;
    run(comm, d);
  };
}

inline Device& EntryDevice(const TensorEntry& e) { return e.device != nullptr ? *e.device : HostDevice(); }

// Whether this rank's entry came with a buffer of the caller's for its result (OutputBuffer).
inline bool HasCallerOutput(const EntryList& entries) { return entries[0] && entries[0]->output != nullptr; }

// The host output of an allgather, alltoall or reducescatter, `bytes` long: the caller's buffer
// where it gave one of that size; else the handle's, or `local` on a rank that joined (it has
// no handle) and on one whose buffer has another size (it is left untouched: CompleteOutput
// fails the operation there after the exchange).
inline char* HostOutput(EntryList& entries, size_t bytes, std::vector<char>& local) {
  if (HasCallerOutput(entries) && entries[0]->output_bytes == bytes) return static_cast<char*>(entries[0]->output);
  std::vector<char>& out = entries[0] && !HasCallerOutput(entries) ? entries[0]->handle->mutable_output() : local;
  out.resize(bytes);
  return out.data();
}

// Completes this rank's handle of a collective whose result, `bytes` long, has `shape`; fails
// it instead where the caller's buffer for the result had another size.
inline void CompleteOutput(EntryList& entries, const Response& r, size_t bytes, std::vector<int64_t> shape) {
  if (!entries[0]) return;
  Handle& h = *entries[0]->handle;
  if (HasCallerOutput(entries) && entries[0]->output_bytes != bytes) {
    return h.Fail(std::string(RequestTypeName(r.type)) + " of '" + r.names[0] + "': the output buffer holds " +
                      std::to_string(entries[0]->output_bytes) + " bytes, the result " + ShapeString(shape) +
                      " of " + DataTypeName(r.dtype) + " is " + std::to_string(bytes),
                  true);
  }
  h.mutable_output_shape() = std::move(shape);
  h.Complete();
}

inline void CompleteAll(EntryList& entries) {
  std::vector<Handle*> handles;
  for (auto& e : entries) {
    if (e) handles.push_back(e->handle.get());
  }
  Handle::CompleteAll(handles);
}

}  // namespace gradcomp
