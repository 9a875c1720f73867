#include "test/support/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "ops/common/half.h"

namespace gradcomp::testing {

std::string ReduceCase::Describe() const {
  std::ostringstream os;
  os << DataTypeName(dtype) << " " << ReduceOpName(op) << " count=" << count;
  if (prescale != 1.0 || postscale != 1.0) os << " prescale=" << prescale << " postscale=" << postscale;
  return os.str();
}

const std::vector<DataType>& AllDataTypes() {
  static const std::vector<DataType> types = {DataType::kUInt8,   DataType::kInt8,    DataType::kInt16,
                                              DataType::kInt32,   DataType::kInt64,   DataType::kFloat16,
                                              DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64,
                                              DataType::kBool};
  return types;
}

std::vector<ReduceCase> AllReduceCases(const std::vector<size_t>& counts) {
  std::vector<ReduceCase> cases;
  for (size_t count : counts) {
    for (DataType dt : AllDataTypes()) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
        if (dt == DataType::kBool && op == ReduceOp::kAverage) continue;
        cases.push_back({dt, op, count});
      }
      if (dt != DataType::kBool) {
        cases.push_back({dt, ReduceOp::kSum, count, 2.0, 0.5});
        cases.push_back({dt, ReduceOp::kAverage, count, 2.0, 0.25});
      }
    }
  }
  return cases;
}

namespace {

uint32_t Mix(uint64_t i, int rank) {
  uint64_t h = i * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank + 1) * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  return static_cast<uint32_t>(h >> 32);
}

// Raw (unrounded) value of element i of rank `rank`: bounded so 8 ranks never overflow.
double RawValue(DataType dt, ReduceOp op, size_t i, int rank) {
  const uint32_t h = Mix(i, rank);
  if (dt == DataType::kBool) return (h % 3) == 0 ? 1.0 : 0.0;
  if (op == ReduceOp::kProduct) {
    // |product| <= 4 for integers, within [0.5^8, 1.5^8] for floats.
    if (IsFloatingPoint(dt)) return 0.5 + static_cast<double>(h % 1024) / 1024.0;
    const double mag = (rank < 2 && (h & 4)) ? 2.0 : 1.0;
    return (dt == DataType::kUInt8 || (h & 1)) ? mag : -mag;
  }
  switch (dt) {
    case DataType::kUInt8: return static_cast<double>(h % 16);               // 8 * 2 * 15 < 256
    case DataType::kInt8: return static_cast<double>(static_cast<int>(h % 15) - 7);
    case DataType::kInt16: return static_cast<double>(static_cast<int>(h % 4001) - 2000);  // 8 * 2 * 2000 < 32768
    case DataType::kInt32: return static_cast<double>(static_cast<int64_t>(h % 2000001) - 1000000);
    case DataType::kInt64: return static_cast<double>(static_cast<int64_t>(h) - (int64_t{1} << 31)) * 1024.0;
    default: return (static_cast<double>(h % 65536) - 32768.0) / 16384.0;  // [-2, 2)
  }
}

}  // namespace

void StoreAt(void* buf, DataType dt, size_t i, double v) {
  switch (dt) {
    case DataType::kUInt8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v); return;
    case DataType::kInt8: static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(v); return;
    case DataType::kInt16: static_cast<int16_t*>(buf)[i] = static_cast<int16_t>(v); return;
    case DataType::kInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); return;
    case DataType::kInt64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); return;
    case DataType::kFloat16: static_cast<uint16_t*>(buf)[i] = FloatToHalfBits(static_cast<float>(v)); return;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(buf)[i] = FloatToBFloat16Bits(static_cast<float>(v));
      return;
    case DataType::kFloat32: static_cast<float*>(buf)[i] = static_cast<float>(v); return;
    case DataType::kFloat64: static_cast<double*>(buf)[i] = v; return;
    case DataType::kBool: static_cast<uint8_t*>(buf)[i] = v != 0.0; return;
  }
}

double ValueAt(const void* buf, DataType dt, size_t i) {
  switch (dt) {
    case DataType::kUInt8: return static_cast<const uint8_t*>(buf)[i];
    case DataType::kInt8: return static_cast<const int8_t*>(buf)[i];
    case DataType::kInt16: return static_cast<const int16_t*>(buf)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(buf)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DataType::kFloat16: return HalfBitsToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kBFloat16: return BFloat16BitsToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kFloat32: return static_cast<const float*>(buf)[i];
    case DataType::kFloat64: return static_cast<const double*>(buf)[i];
    case DataType::kBool: return static_cast<const uint8_t*>(buf)[i];
  }
  return 0;
}

std::vector<char> MakeInput(DataType dtype, ReduceOp op, size_t count, int rank) {
  std::vector<char> buf(count * DataTypeSize(dtype));
  for (size_t i = 0; i < count; ++i) StoreAt(buf.data(), dtype, i, RawValue(dtype, op, i, rank));
  return buf;
}

namespace {
// Exact input value after storing into the dtype (what the collective actually sees).
double Input(const ReduceCase& c, size_t i, int rank) {
  char tmp[8];
  StoreAt(tmp, c.dtype, 0, RawValue(c.dtype, c.op, i, rank));
  double v = ValueAt(tmp, c.dtype, 0);
  if (c.prescale != 1.0) {
    // Prescale is applied in the dtype: integers truncate, 16-bit floats round.
    StoreAt(tmp, c.dtype, 0, v * c.prescale);
    v = ValueAt(tmp, c.dtype, 0);
  }
  return v;
}
}  // namespace

std::vector<double> ExpectedReduction(const ReduceCase& c, int world, size_t begin, size_t n) {
  std::vector<double> out(n);
  const bool is_int = !IsFloatingPoint(c.dtype) && c.dtype != DataType::kBool;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = begin + k;
    double acc = Input(c, i, 0);
    for (int r = 1; r < world; ++r) {
      const double x = Input(c, i, r);
      switch (c.op) {
        case ReduceOp::kSum:
        case ReduceOp::kAverage: acc += x; break;
        case ReduceOp::kProduct: acc *= x; break;
        case ReduceOp::kMin: acc = std::min(acc, x); break;
        case ReduceOp::kMax: acc = std::max(acc, x); break;
        case ReduceOp::kBitwiseAnd:
          acc = static_cast<double>(static_cast<int64_t>(acc) & static_cast<int64_t>(x));
          break;
        case ReduceOp::kAdasum: throw std::logic_error("Adasum is not element-wise (test_adasum has its reference)");
      }
    }
    if (c.dtype == DataType::kBool) acc = acc != 0.0 ? 1.0 : 0.0;
    if (c.op == ReduceOp::kAverage) acc = is_int ? std::trunc(acc / world) : acc / world;
    if (c.postscale != 1.0) acc = is_int ? std::trunc(acc * c.postscale) : acc * c.postscale;
    out[k] = acc;
  }
  return out;
}

std::string CompareReduction(const ReduceCase& c, int world, const void* out, const std::vector<double>& expected) {
  // Relative tolerance of one rounding in the dtype, times the number of roundings a
  // reduction over `world` ranks can make, applied to the magnitude of the terms (<= 2^2
  // per term for floats, scaled by prescale/postscale).
  double eps = 0;
  switch (c.dtype) {
    case DataType::kFloat16: eps = std::ldexp(1.0, -11); break;
    case DataType::kBFloat16: eps = std::ldexp(1.0, -8); break;
    case DataType::kFloat32: eps = std::ldexp(1.0, -24); break;
    case DataType::kFloat64: eps = std::ldexp(1.0, -53); break;
    default: eps = 0; break;
  }
  const double term = (c.op == ReduceOp::kProduct ? 26.0 : 2.0) * c.prescale * std::max(1.0, c.postscale);
  const double tol = eps * (world + 3) * term * world;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double got = ValueAt(out, c.dtype, i);
    const double want = expected[i];
    const double err = std::fabs(got - want);
    const bool ok = (eps == 0) ? (got == want) : (err <= tol + eps * std::fabs(want));
    if (!ok) {
      std::ostringstream os;
      os << c.Describe() << " world=" << world << ": element " << i << " is " << got << ", expected " << want
         << " (tolerance " << tol << ")";
      return os.str();
    }
  }
  return "";
}

AllreduceOptions ToAllreduceOptions(const ReduceCase& c, const void* in, void* out) {
  AllreduceOptions o;
  o.input = in;
  o.output = out;
  o.count = c.count;
  o.dtype = c.dtype;
  o.op = c.op;
  o.prescale = c.prescale;
  o.postscale = c.postscale;
  o.name = "grad";
  return o;
}

ReducescatterOptions ToReducescatterOptions(const ReduceCase& c, const void* in, void* out,
                                            const std::vector<size_t>& counts) {
  ReducescatterOptions o;
  o.input = in;
  o.output = out;
  o.counts = counts;
  o.dtype = c.dtype;
  o.op = c.op;
  o.prescale = c.prescale;
  o.postscale = c.postscale;
  o.name = "grad";
  return o;
}

}  // namespace gradcomp::testing
