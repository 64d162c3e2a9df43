#include "base/flags.h"

#include <catch2/catch.hpp>

namespace agentix::base {
namespace {

TEST_CASE("Dashed flag names become absl identifiers; values stay",
          "[base]") {
  std::vector<std::string> in = {"prog",          "--python-path=/a-b",
                                 "--log-level",   "x-y",
                                 "-worker-id=1",  "--",
                                 "--not-a-flag"};
  std::vector<char*> argv;
  for (auto& s : in) argv.push_back(s.data());
  std::vector<std::string> storage;
  auto out = NormalizeFlagNames(static_cast<int>(argv.size()), argv.data(),
                                storage);
  REQUIRE(out.size() == in.size() + 1);
  REQUIRE(out.back() == nullptr);
  REQUIRE(std::string(out[1]) == "--python_path=/a-b");
  REQUIRE(std::string(out[2]) == "--log_level");
  REQUIRE(std::string(out[3]) == "x-y");
  REQUIRE(std::string(out[4]) == "-worker_id=1");
  REQUIRE(std::string(out[6]) == "--not-a-flag");
}

TEST_CASE("--help lists our flags, not absl's own", "[base]") {
  REQUIRE(IsOwnFlagFile("sandbox/sandboxd_main.cc"));
  REQUIRE(IsOwnFlagFile("bundler/bundler_main.cc"));
  REQUIRE_FALSE(IsOwnFlagFile("/build/abseil-cpp/absl/flags/parse.cc"));
  REQUIRE_FALSE(IsOwnFlagFile("absl/flags/internal/usage.cc"));
}

}  // namespace
}  // namespace agentix::base
