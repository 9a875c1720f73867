// Element types and reduction operators understood by every layer of gradcomp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gradcomp {

/// Element type of a buffer. The numeric values are part of the C ABI and the wire format
/// of negotiation messages: never renumber.
enum class DataType : uint8_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kFloat16 = 4,
  kBFloat16 = 5,
  kFloat32 = 6,
  kFloat64 = 7,
  kBool = 8,
  kInt16 = 9,
};
inline constexpr int kNumDataTypes = 10;

/// Reduction applied by allreduce / reducescatter. Average is Sum followed by a division
/// by the number of ranks; the communicators only ever see Sum, Min, Max and Product.
/// Adasum (allreduce of floating-point tensors only) is gradcomp's own algorithm over
/// point-to-point messages (ops/collectives/adasum.h), never a communicator's reduction.
enum class ReduceOp : uint8_t {
  kSum = 0,
  kAverage = 1,
  kMin = 2,
  kMax = 3,
  kProduct = 4,
  /// Bitwise AND of integers; internal to the runtime (negotiation bit vectors).
  kBitwiseAnd = 5,
  /// Horovod's hvd.Adasum: the adaptive sum of each tensor's vectors (ops/collectives/adasum.h).
  kAdasum = 6,
};
inline constexpr int kNumReduceOps = 7;

/// Size in bytes of one element of `dtype`.
size_t DataTypeSize(DataType dtype);
/// Lower-case name ("float32", "bfloat16", ...), as users see it in error messages.
const char* DataTypeName(DataType dtype);
/// Name of a reduction ("sum", "average", ...).
const char* ReduceOpName(ReduceOp op);
/// Parses a DataType from its numeric value; throws naming the value when it is unknown.
DataType DataTypeFromInt(int value);
/// Parses a ReduceOp from its numeric value; throws naming the value when it is unknown.
ReduceOp ReduceOpFromInt(int value);
/// True for float16, bfloat16, float32 and float64.
bool IsFloatingPoint(DataType dtype);
/// True for float32, float16 and bfloat16: what codecs, casts and the GPU's arithmetic take.
bool IsFloat32Or16(DataType dtype);

}  // namespace gradcomp
