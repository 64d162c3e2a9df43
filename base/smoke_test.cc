#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#include <grpcpp/grpcpp.h>
#include <msgpack.hpp>
#include <fmt/format.h>
#include <Python.h>
#include "absl/status/status.h"
TEST_CASE("smoke") { REQUIRE(absl::OkStatus().ok()); REQUIRE(fmt::format("{}", 1) == "1"); }
