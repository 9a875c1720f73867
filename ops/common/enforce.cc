#include "ops/common/enforce.h"

namespace gradcomp::detail {

void ThrowEnforce(const char* file, int line, const char* cond, const std::string& msg) {
  std::string what = StrCat("gradcomp internal check failed at ", file, ":", line, ": ", cond);
  if (!msg.empty()) what += ": " + msg;
  throw Error(what);
}

}  // namespace gradcomp::detail
