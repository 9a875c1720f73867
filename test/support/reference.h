// Deterministic inputs and float64 references for collective tests. Every rank can build
// any rank's input, so expected results need no communication.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "ops/collectives/allreduce.h"
#include "ops/collectives/reducescatter.h"
#include "ops/common/dtype.h"

namespace gradcomp::testing {

/// One reduction case of a sweep.
struct ReduceCase {
  DataType dtype;
  ReduceOp op;
  size_t count;
  double prescale = 1.0;
  double postscale = 1.0;
  std::string Describe() const;
};

/// Every supported (dtype, op) pair (bool has no Average) at the given counts, plus a
/// prescale/postscale variant of Sum and Average for each dtype.
std::vector<ReduceCase> AllReduceCases(const std::vector<size_t>& counts);

/// Data types tested by sweeps.
const std::vector<DataType>& AllDataTypes();

/// Rank `rank`'s input for a case: `count` elements of `dtype`, values exactly representable
/// in the dtype and bounded so that no reduction over 8 ranks overflows.
std::vector<char> MakeInput(DataType dtype, ReduceOp op, size_t count, int rank);

/// The value of element i of a typed buffer, as float64.
double ValueAt(const void* buf, DataType dtype, size_t i);
/// Stores `v` (rounded as the dtype does) into element i of a typed buffer.
void StoreAt(void* buf, DataType dtype, size_t i, double v);

/// float64 reference of allreduce over `world` ranks (elements [begin, begin + n)).
std::vector<double> ExpectedReduction(const ReduceCase& c, int world, size_t begin, size_t n);

/// Compares `out` with `expected` (same length) within the dtype's tolerance: exact for
/// integers and bool, a few roundings of the dtype for floats. Returns "" or a description
/// of the first mismatch.
std::string CompareReduction(const ReduceCase& c, int world, const void* out, const std::vector<double>& expected);

/// The allreduce of a case from `in` to `out` (tensor name "grad").
AllreduceOptions ToAllreduceOptions(const ReduceCase& c, const void* in, void* out);
/// The reducescatter of a case with the given per-rank counts.
ReducescatterOptions ToReducescatterOptions(const ReduceCase& c, const void* in, void* out,
                                            const std::vector<size_t>& counts);

/// True if the n bytes at a and b are equal (memcmp, which may not be given the null
/// pointers of empty vectors).
inline bool SameBytes(const void* a, const void* b, size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

}  // namespace gradcomp::testing
