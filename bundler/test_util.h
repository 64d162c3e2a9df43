// Scratch directories for the bundler's unit tests.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace agentix::bundler::testing {

// A fresh, empty directory under $TEST_TMPDIR (or /tmp) named `name`.
inline std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::filesystem::path dir =
      std::filesystem::path(base != nullptr ? base : "/tmp") / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace agentix::bundler::testing
