#include "ops/comm/communicator.h"

#include "ops/common/enforce.h"

namespace gradcomp {

std::vector<size_t> EvenSplit(size_t count, int parts) {
  GC_ENFORCE(parts > 0, "EvenSplit needs at least one part, got ", parts);
  std::vector<size_t> sizes(static_cast<size_t>(parts), count / static_cast<size_t>(parts));
  const size_t rest = count % static_cast<size_t>(parts);
  for (size_t i = 0; i < rest; ++i) sizes[i] += 1;
  return sizes;
}

std::vector<size_t> Offsets(const std::vector<size_t>& sizes) {
  std::vector<size_t> offsets(sizes.size(), 0);
  size_t running = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    offsets[i] = running;
    running += sizes[i];
  }
  return offsets;
}

}  // namespace gradcomp
