#include "ops/comm/communicator.h"

#include <cstdint>

#include "ops/common/enforce.h"

namespace gradcomp {

std::vector<std::string> AllgatherStrings(Communicator& comm, const std::string& mine) {
  const size_t n = static_cast<size_t>(comm.size());
  std::vector<uint64_t> lens(n);
  const uint64_t my_len = mine.size();
  comm.Allgatherv(&my_len, lens.data(), std::vector<size_t>(n, sizeof(uint64_t)));
  const std::vector<size_t> bytes(lens.begin(), lens.end());
  const std::vector<size_t> offsets = Offsets(bytes);
  std::string all(offsets.back() + bytes.back(), '\0');
  comm.Allgatherv(mine.data(), all.data(), bytes);
  std::vector<std::string> out;
  for (size_t r = 0; r < n; ++r) out.push_back(all.substr(offsets[r], bytes[r]));
  return out;
}

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
