// What ranks tell the coordinator (Request) and what it tells them back (Response), with
// the compact binary encoding that travels in negotiation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/common/dtype.h"
#include "ops/common/shape.h"
#include "ops/compression/spec.h"

namespace gradcomp {

/// The collective a request asks for.
enum class RequestType : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kBarrier = 5,
  kJoin = 6,
};
inline constexpr int kNumRequestTypes = 7;
/// "allreduce", "allgather", ...
const char* RequestTypeName(RequestType type);

/// One rank's request for one named tensor.
struct Request {
  int32_t rank = 0;
  RequestType type = RequestType::kAllreduce;
  std::string name;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  ReduceOp op = ReduceOp::kSum;
  int32_t root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  CompressionSpec compression;
  /// alltoall: rows sent to each rank (sums to shape[0]).
  std::vector<int64_t> splits;
  /// The tensor lives in a device's memory on this rank (allreduce, broadcast).
  bool on_device = false;
  /// Scheduling order among tensors ready at once: lower runs first (default 0; see
  /// GRADCOMP_SCHEDULING_CREDIT_MB in core/controller.h). Must agree across ranks.
  int32_t priority = 0;

  /// Product of the shape (1 for a scalar).
  int64_t NumElements() const;
  /// Calls f(field) on every field in wire order: the one list the encoding writes and reads
  /// (core/message.cc), as CompressionSpec::ForEachField is the spec's. `Self`: (const) Request.
  template <typename Self, typename F>
  static void ForEachField(Self& r, F&& f) {
    f(r.rank);
    f(r.type);
    f(r.name);
    f(r.dtype);
    f(r.shape);
    f(r.op);
    f(r.root);
    f(r.prescale);
    f(r.postscale);
    f(r.compression);
    f(r.splits);
    f(r.on_device);
    f(r.priority);
  }
};

/// What every rank executes, in the same order. A response names one tensor, or several
/// fused allreduce tensors sharing dtype, op, scale factors and compression.
struct Response {
  RequestType type = RequestType::kAllreduce;
  /// Non-empty: the operation failed; every rank fails these tensors with this message.
  std::string error;
  std::vector<std::string> names;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int32_t root = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  CompressionSpec compression;
  /// Shape of every tensor (ranks that joined use it to contribute zeros).
  std::vector<std::vector<int64_t>> shapes;
  /// allgather: first dimension of every rank, per tensor (names.size() x size values).
  /// alltoall: the size x size matrix of rows sent (row = sender).
  std::vector<int64_t> rank_dims;
  /// join: the last rank to join.
  int32_t last_joined = -1;
  /// The tensors are in device memory on every rank (and no rank has joined): the executor may
  /// hand them to communicators that take device memory.
  bool on_device = false;
  /// Every tensor's priority (the requests'); empty reads as all 0.
  std::vector<int64_t> priorities;

  /// Bytes of the named tensors' payload (for fusion decisions).
  int64_t PayloadBytes() const;
  /// The most urgent (lowest) priority among the tensors.
  int64_t Priority() const;
  /// The response of tensor k alone (a fused response unfused), without copying the others.
  Response Single(size_t k) const;
  /// Calls f(field) on every field in wire order (as Request::ForEachField).
  template <typename Self, typename F>
  static void ForEachField(Self& r, F&& f) {
    f(r.type);
    f(r.error);
    f(r.names);
    f(r.dtype);
    f(r.op);
    f(r.root);
    f(r.prescale);
    f(r.postscale);
    f(r.compression);
    f(r.shapes);
    f(r.rank_dims);
    f(r.last_joined);
    f(r.on_device);
    f(r.priorities);
  }
};

/// Binary encoding of request and response lists (little-endian, length-prefixed).
std::string SerializeRequests(const std::vector<Request>& requests);
std::vector<Request> ParseRequests(const std::string& bytes);
std::string SerializeResponses(const std::vector<Response>& responses);
std::vector<Response> ParseResponses(const std::string& bytes);

}  // namespace gradcomp
