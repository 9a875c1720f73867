// gradcomp-settings: prints every setting of the registry as a Markdown table (docs/settings.md's
// table is this output, checked by a test).
#include <cstdio>

#include "core/settings.h"

int main() {
  std::fputs(gradcomp::SettingsMarkdownTable().c_str(), stdout);
  return 0;
}
