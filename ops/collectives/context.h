// Adds the collective and tensor name to any error raised inside a collective, so the
// message that reaches the user says which tensor failed where.
#pragma once

#include <string>

#include "ops/common/enforce.h"

namespace gradcomp {

/// Runs `body`; a gradcomp::Error escaping it is rethrown with " [<what> of tensor '<name>']"
/// appended (the type is kept for InvalidArgument).
template <typename Body>
void WithTensorContext(const char* what, const std::string& name, Body&& body) {
  try {
    body();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(e.what()) + " [" + what + " of tensor '" + name + "']");
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " [" + what + " of tensor '" + name + "']");
  }
}

}  // namespace gradcomp
