#include "host/python/native/call_start_wire.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "agentix/runtime/v1/runtime.pb.h"
#include "host/python/native/proto_test_bytes.h"

namespace agentix::host {
namespace {

using runtime::v1::CallsRequest;

std::string Encode(const std::vector<std::string_view>& acks, const StartCallParts& start,
                   uint8_t frame_kind = 0) {
  std::string out(CallsRequestSize(acks, start, frame_kind), '\0');
  REQUIRE(EncodeCallsRequest(acks, start, frame_kind, out.data()) == out.size());
  return out;
}

// StartCall.callable "bench_targets::noop" and encoding pickle, as wire._start_fields encodes them.
std::string CallableFields(const std::string& callable) {
  std::string fields;
  test_bytes::AppendBytesField(fields, 2, callable);
  test_bytes::AppendTag(fields, 3, 0);
  test_bytes::AppendVarint(fields, runtime::v1::ENCODING_PICKLE);
  return fields;
}

TEST_CASE("A StartCall with acks encodes as protobuf serializes it", "[call_start_wire]") {
  const std::string callable = "bench_targets::noop";
  const std::string fields = CallableFields(callable);
  const std::string arguments(GENERATE(0, 1, 127, 128, 300, 4095, 20000), 'a');
  const std::string context = GENERATE(std::string(), std::string("\x80\x05}\x94.", 5), std::string(200, 'c'));
  const uint32_t window = GENERATE(0u, 1u, 300u);
  const std::vector<std::string_view> acks = GENERATE(std::vector<std::string_view>{},
                                                      std::vector<std::string_view>{"eab30144a6f622fc0000000000000001"},
                                                      std::vector<std::string_view>{"a", "", std::string_view(
                                                          "a long id that goes past one hundred and twenty-seven "
                                                          "bytes, so that its lengths take two bytes each in the "
                                                          "ack event's three nested headers")});
  StartCallParts start;
  start.call_id = "eab30144a6f622fc0000000000000002";
  start.callable_fields = fields;
  start.arguments = arguments;
  start.context = context;
  start.stream_window = window;

  CallsRequest expected;
  for (std::string_view id : acks) expected.add_events()->mutable_ack()->set_call_id(std::string(id));
  auto* call = expected.add_events()->mutable_start();
  call->set_call_id(std::string(start.call_id));
  call->set_callable(callable);
  call->set_encoding(runtime::v1::ENCODING_PICKLE);
  call->set_arguments(arguments);
  call->set_arguments_size(arguments.size());
  call->set_context(context);
  call->set_stream_window(window);
  std::string serialized;
  REQUIRE(expected.SerializeToString(&serialized));
  CHECK(Encode(acks, start) == serialized);
}

TEST_CASE("A plain context's fields are written as given, and read back as protobuf's", "[call_start_wire]") {
  const std::string fields = CallableFields("m::f");
  std::string context;
  test_bytes::AppendBytesField(context, 8, "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01");
  test_bytes::AppendBytesField(context, 9, "agentix=0123456789abcdef01234567");
  StartCallParts start;
  start.call_id = "id";
  start.callable_fields = fields;
  start.arguments = "args";
  start.context = context;
  start.context_is_fields = true;
  start.stream_window = 8;
  CallsRequest parsed;
  REQUIRE(parsed.ParseFromString(Encode({}, start)));
  REQUIRE(parsed.events_size() == 1);
  const auto& call = parsed.events(0).start();
  CHECK(call.call_id() == "id");
  CHECK(call.callable() == "m::f");
  CHECK(call.arguments() == "args");
  CHECK(call.arguments_size() == 4);
  CHECK(call.context().empty());
  CHECK(call.traceparent() == "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01");
  CHECK(call.tracestate() == "agentix=0123456789abcdef01234567");
  CHECK(call.stream_window() == 8);
}

TEST_CASE("A frame kind puts the frame wire's header in front", "[call_start_wire]") {
  const std::string fields = CallableFields("m::f");
  StartCallParts start;
  start.call_id = "id";
  start.callable_fields = fields;
  start.arguments = "x";
  const std::string message = Encode({"done"}, start);
  const std::string framed = Encode({"done"}, start, 2);
  REQUIRE(framed.size() == message.size() + kFrameHeaderBytes);
  CHECK(static_cast<uint8_t>(framed[0]) == message.size());
  CHECK(framed.substr(1, 3) == std::string(3, '\0'));
  CHECK(framed[4] == 2);
  CHECK(framed.substr(kFrameHeaderBytes) == message);
}

}  // namespace
}  // namespace agentix::host
