#include "ops/common/enforce.h"

namespace gradcomp {

std::string NumberRanges(const std::vector<int>& ascending, const char* separator) {
  std::string text;
  for (size_t i = 0; i < ascending.size();) {
    size_t j = i;
    while (j + 1 < ascending.size() && ascending[j + 1] == ascending[j] + 1) ++j;
    if (!text.empty()) text += separator;
    text += std::to_string(ascending[i]) + (j > i ? "-" + std::to_string(ascending[j]) : "");
    i = j + 1;
  }
  return text;
}

}  // namespace gradcomp

namespace gradcomp::detail {

void ThrowEnforce(const char* file, int line, const char* cond, const std::string& msg) {
  std::string what = StrCat("gradcomp internal check failed at ", file, ":", line, ": ", cond);
  if (!msg.empty()) what += ": " + msg;
  throw Error(what);
}

}  // namespace gradcomp::detail
