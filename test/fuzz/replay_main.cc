// The driver of the harnesses outside libFuzzer: `NAME FILE_OR_DIR...` runs every file
// through LLVMFuzzerTestOneInput (the corpus replay ctest runs); `NAME --write-seeds DIR`
// writes the harness's seed inputs.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "test/fuzz/fuzz.h"

namespace {
namespace fs = std::filesystem;

int RunFile(const fs::path& path) {
  std::vector<uint8_t> bytes(fs::file_size(path));
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr || std::fread(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
    std::cerr << path << ": cannot read\n";
    std::exit(2);
  }
  std::fclose(f);
  return LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
}
}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--write-seeds") {
    fs::create_directories(argv[2]);
    const std::vector<std::string> seeds = gradcomp::fuzz::Seeds();
    for (size_t i = 0; i < seeds.size(); ++i) {
      std::ofstream(fs::path(argv[2]) / ("seed-" + std::to_string(i)), std::ios::binary) << seeds[i];
    }
    std::cout << "wrote " << seeds.size() << " seeds to " << argv[2] << "\n";
    return 0;
  }
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " FILE_OR_DIR... | --write-seeds DIR\n";
    return 2;
  }
  size_t runs = 0;
  for (int a = 1; a < argc; ++a) {
    const fs::path p(argv[a]);
    if (!fs::exists(p)) {
      std::cerr << argv[a] << ": no such file or directory\n";
      return 2;
    }
    if (fs::is_directory(p)) {
      for (const auto& e : fs::recursive_directory_iterator(p)) {
        if (e.is_regular_file()) {
          RunFile(e.path());
          ++runs;
        }
      }
    } else {
      RunFile(p);
      ++runs;
    }
  }
  if (runs == 0) {
    std::cerr << "no inputs found: an empty corpus replays nothing\n";
    return 1;
  }
  std::cout << runs << " inputs replayed cleanly\n";
  return 0;
}
