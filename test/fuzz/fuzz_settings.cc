// Fuzzes the settings parser with the variables a user can set: lines of NAME=VALUE where
// NAME is one of the registry's variables (or their CGX aliases) picked by a byte, or
// arbitrary text. Every outcome is a Settings or a gradcomp::InvalidArgument naming the
// variable; nothing else may escape.
#include <map>
#include <string>
#include <vector>

#include "core/settings.h"
#include "ops/common/enforce.h"
#include "test/fuzz/fuzz.h"

namespace gradcomp::fuzz {

namespace {
std::vector<std::string> Names() {
  std::vector<std::string> names;
  for (const SettingInfo& s : DescribeSettings()) {
    names.push_back(s.name);
    if (!s.alias.empty()) names.push_back(s.alias);
  }
  return names;
}
}  // namespace

std::vector<std::string> Seeds() {
  // Byte 0 of a line picks the variable (index into Names(), 0xff: the name follows).
  std::vector<std::string> seeds;
  const std::vector<std::string> values = {"4", "maxmin", "1", "0.5", "true", "", "-3", "1e400", "nan", "64"};
  const std::vector<std::string> names = Names();
  std::string all;
  for (size_t i = 0; i < names.size(); ++i) {
    std::string line = std::string(1, static_cast<char>(i)) + values[i % values.size()] + "\n";
    seeds.push_back(line);
    all += line;
  }
  seeds.push_back(all);
  seeds.push_back(std::string(1, '\xff') + "GRADCOMP_BOGUS=1\n");
  return seeds;
}

}  // namespace gradcomp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradcomp;
  static const std::vector<std::string> names = fuzz::Names();
  std::map<std::string, std::string> vars;
  size_t at = 0;
  while (at < size) {
    const uint8_t pick = data[at++];
    size_t end = at;
    while (end < size && data[end] != '\n') ++end;
    std::string text(reinterpret_cast<const char*>(data) + at, end - at);
    at = end + 1;
    if (pick < names.size()) {
      vars[names[pick]] = text;
    } else {
      const size_t eq = text.find('=');
      vars[text.substr(0, eq)] = eq == std::string::npos ? "" : text.substr(eq + 1);
    }
  }
  try {
    const Settings s = Settings::FromMap(vars);
    (void)s;
  } catch (const InvalidArgument&) {
    // A bad value is rejected with a message naming the variable.
  }
  return 0;
}
