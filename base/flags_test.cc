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

TEST_CASE("a repeatable flag is taken out of argv in both spellings, up to "
          "a bare --") {
  std::vector<std::string> args = {
      "prog", "--listen", "unix:///a.sock", "--token-file=/t",
      "--listen=127.0.0.1:5", "--", "--listen", "c"};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  int argc = static_cast<int>(argv.size());
  const std::vector<std::string> values =
      ExtractRepeatedFlag("--listen", argc, argv.data());
  CHECK(values == std::vector<std::string>{"unix:///a.sock", "127.0.0.1:5"});
  std::vector<std::string> rest(argv.begin(), argv.begin() + argc);
  CHECK(rest == std::vector<std::string>{"prog", "--token-file=/t", "--",
                                         "--listen", "c"});
  // A last "--listen" without a value is left for absl to refuse.
  std::vector<std::string> lone = {"prog", "--listen"};
  std::vector<char*> lone_argv = {lone[0].data(), lone[1].data()};
  int lone_argc = 2;
  CHECK(ExtractRepeatedFlag("--listen", lone_argc, lone_argv.data()).empty());
  CHECK(lone_argc == 2);
}

}  // namespace
}  // namespace agentix::base
