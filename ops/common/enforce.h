// Error type and the two tiers of checks used across gradcomp (see docs/errors.md):
// GC_ENFORCE for invariants (throws with file:line and the failed condition), and
// gradcomp::Error for user-facing failures whose message names the value at fault.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradcomp {

/// Every failure gradcomp reports is (or derives from) this exception.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// A bad argument from the caller (duplicate names, impossible shapes): maps to ValueError.
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& what) : Error(what) {}
};

/// Ascending numbers with their runs shortened, for messages and logs: "0-3, 8" (separator
/// ", "), "0-3,8" (","): a large job's ranks or a machine's CPUs in one line.
std::string NumberRanges(const std::vector<int>& ascending, const char* separator);

namespace detail {
/// Concatenates any streamable arguments into one string.
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void ThrowEnforce(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace gradcomp

/// Checks an invariant; on failure throws gradcomp::Error naming file:line, the condition
/// and the streamed message (at least one message argument is required).
#define GC_ENFORCE(cond, ...)                                                           \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      ::gradcomp::detail::ThrowEnforce(__FILE__, __LINE__, #cond,                       \
                                       ::gradcomp::detail::StrCat(__VA_ARGS__));          \
    }                                                                                   \
  } while (0)

/// Throws gradcomp::Error with the streamed message (a user-facing failure, no file:line).
#define GC_THROW(...) throw ::gradcomp::Error(::gradcomp::detail::StrCat(__VA_ARGS__))
