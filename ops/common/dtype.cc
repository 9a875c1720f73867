#include "ops/common/dtype.h"

#include "ops/common/enforce.h"

namespace gradcomp {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
    case DataType::kInt16:
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kFloat64:
      return 8;
  }
  GC_THROW("unknown data type code ", static_cast<int>(dtype));
}

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return "uint8";
    case DataType::kInt8: return "int8";
    case DataType::kInt16: return "int16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBool: return "bool";
  }
  return "unknown";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAverage: return "average";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
    case ReduceOp::kBitwiseAnd: return "bitwise_and";
    case ReduceOp::kAdasum: return "adasum";
  }
  return "unknown";
}

DataType DataTypeFromInt(int value) {
  if (value < 0 || value >= kNumDataTypes) {
    throw InvalidArgument(detail::StrCat("unknown data type code ", value, " (expected 0..", kNumDataTypes - 1, ")"));
  }
  return static_cast<DataType>(value);
}

ReduceOp ReduceOpFromInt(int value) {
  // kBitwiseAnd (5) is the runtime's own.
  if (value < 0 || value > static_cast<int>(ReduceOp::kAdasum) || value == static_cast<int>(ReduceOp::kBitwiseAnd)) {
    throw InvalidArgument(detail::StrCat("unknown reduce op code ", value,
                                         " (expected 0..4 or 6: sum, average, min, max, product, adasum)"));
  }
  return static_cast<ReduceOp>(value);
}

bool IsFloatingPoint(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 ||
         dtype == DataType::kFloat32 || dtype == DataType::kFloat64;
}

bool IsFloat32Or16(DataType dtype) {
  return dtype == DataType::kFloat32 || dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
}

}  // namespace gradcomp
