// Tensor shapes: element counts and how users read them. Shared by the data plane and the
// runtime (which validates and negotiates shapes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradcomp {

/// Number of elements of a shape (1 for a scalar).
int64_t NumElements(const std::vector<int64_t>& shape);

/// "[2, 3]": a shape as users read it (also valid JSON).
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace gradcomp
