#include "wire/call_context.h"

#include <catch2/catch.hpp>

namespace agentix::sandbox {
namespace {

constexpr char kGood[] =
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TEST_CASE("W3C traceparents are accepted or refused by the spec's rules",
          "[call_context]") {
  CHECK(CheckTraceparent(kGood).ok());
  // A later version may carry more fields after a '-'.
  CHECK(CheckTraceparent(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x")
            .ok());
  for (const char* bad : {
           "",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
           "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz",
           "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
       }) {
    INFO(bad);
    const absl::Status status = CheckTraceparent(bad);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(status.message()).find("StartCall.traceparent") !=
          std::string::npos);
  }
}

TEST_CASE("Plain context fields are checked and encoded for the worker",
          "[call_context]") {
  runtime::v1::StartCall start;
  CHECK(CheckCallContext(start).ok());
  CHECK(WorkerContext(start).empty());

  start.set_traceparent(kGood);
  start.set_tracestate("agentix=00f067aa0ba902b7aabbccdd,other=1");
  (*start.mutable_baggage())["run"] = "r42";
  CHECK(CheckCallContext(start).ok());
  std::string expected(kPlainContextMagic);
  auto put = [&](std::string_view s) {
    expected.push_back(static_cast<char>(s.size()));
    expected.append(3, '\0');
    expected.append(s);
  };
  put(kGood);
  put("agentix=00f067aa0ba902b7aabbccdd,other=1");
  put("run");
  put("r42");
  CHECK(WorkerContext(start) == expected);

  SECTION("the pickle and the plain fields together are refused") {
    start.set_context("\x80\x05pickle");
    CHECK(CheckCallContext(start).code() ==
          absl::StatusCode::kInvalidArgument);
  }
  SECTION("an empty baggage key is refused") {
    (*start.mutable_baggage())[""] = "v";
    CHECK(CheckCallContext(start).code() ==
          absl::StatusCode::kInvalidArgument);
  }
  SECTION("a malformed traceparent is refused") {
    start.set_traceparent("00-abc");
    CHECK(CheckCallContext(start).code() ==
          absl::StatusCode::kInvalidArgument);
  }
  SECTION("a pickle alone is passed on unchanged") {
    runtime::v1::StartCall pickled;
    pickled.set_context("\x80\x05pickle");
    CHECK(CheckCallContext(pickled).ok());
    CHECK(WorkerContext(pickled) == "\x80\x05pickle");
  }
}

}  // namespace
}  // namespace agentix::sandbox
