#include "host/python/native/call_results_wire.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>

#include "agentix/runtime/v1/runtime.pb.h"
#include "host/python/native/proto_test_bytes.h"

namespace agentix::host {
namespace {

using runtime::v1::CallsResponse;

// What protobuf reads from `bytes` equals what the decoder returned.
void RequireSameAsProtobuf(const std::string& bytes,
                           const std::vector<CallResultView>& results) {
  CallsResponse parsed;
  REQUIRE(parsed.ParseFromString(bytes));
  REQUIRE(results.size() == static_cast<size_t>(parsed.events_size()));
  for (int i = 0; i < parsed.events_size(); ++i) {
    REQUIRE(parsed.events(i).has_result());
    const auto& result = parsed.events(i).result();
    const CallResultView& view = results[static_cast<size_t>(i)];
    CHECK(view.call_id == result.call_id());
    CHECK(view.encoding == static_cast<uint64_t>(result.encoding()));
    CHECK(view.value == result.value());
    CHECK(view.value_size == result.value_size());
    CHECK(view.log_seq == result.log_seq());
    CHECK(view.trace_seq == result.trace_seq());
  }
}

using test_bytes::AppendBytesField;
using test_bytes::AppendTag;
using test_bytes::AppendVarint;
// A CallsResponse of one SandboxEvent holding `result` (CallResult bytes).
std::string OneResult(const std::string& result) {
  std::string event;
  AppendBytesField(event, 2, result);
  std::string bytes;
  AppendBytesField(bytes, 1, event);
  return bytes;
}

TEST_CASE("Responses of CallResults decode as protobuf reads them",
          "[call_results_wire]") {
  CallsResponse response;
  auto* noop = response.add_events()->mutable_result();
  noop->set_call_id("eab30144a6f622fc0000000000000001");
  noop->set_encoding(runtime::v1::ENCODING_PICKLE);
  noop->set_value(std::string("\x80\x05N.", 4));
  auto* big = response.add_events()->mutable_result();
  big->set_call_id("appel-été-𝄞");
  big->set_value(std::string(300, '\0'));
  big->set_value_size(1 << 21);
  big->set_log_seq(UINT64_MAX);
  big->set_trace_seq(12345678901234);
  response.add_events()->mutable_result();  // every field at its default
  const std::string bytes = response.SerializeAsString();

  auto results = DecodeCallResults(bytes);
  REQUIRE(results.has_value());
  REQUIRE(results->size() == 3);
  CHECK((*results)[0].encoding == 1);
  CHECK((*results)[1].log_seq == UINT64_MAX);
  CHECK((*results)[2].call_id.empty());
  RequireSameAsProtobuf(bytes, *results);

  auto empty = DecodeCallResults("");
  REQUIRE(empty.has_value());
  CHECK(empty->empty());
}

TEST_CASE("A field given twice keeps its last value", "[call_results_wire]") {
  std::string result;
  AppendBytesField(result, 1, "first");
  AppendBytesField(result, 3, "old");
  AppendTag(result, 5, 0);
  AppendVarint(result, 7);
  AppendBytesField(result, 1, "second");
  AppendBytesField(result, 3, "new");
  AppendTag(result, 5, 0);
  AppendVarint(result, 9);
  const std::string bytes = OneResult(result);
  auto results = DecodeCallResults(bytes);
  REQUIRE(results.has_value());
  REQUIRE(results->size() == 1);
  CHECK((*results)[0].call_id == "second");
  CHECK((*results)[0].value == "new");
  CHECK((*results)[0].log_seq == 9);
  RequireSameAsProtobuf(bytes, *results);
}

TEST_CASE("Anything but plain CallResults is left to protobuf",
          "[call_results_wire]") {
  CallsResponse other;
  other.add_events()->mutable_result()->set_call_id("a");
  other.add_events()->mutable_error()->set_call_id("b");
  CHECK_FALSE(DecodeCallResults(other.SerializeAsString()).has_value());
  CallsResponse chunk;
  chunk.add_events()->mutable_result_chunk()->set_data("x");
  CHECK_FALSE(DecodeCallResults(chunk.SerializeAsString()).has_value());

  std::string encoding;  // an encoding other than unspecified or pickle
  AppendTag(encoding, 2, 0);
  AppendVarint(encoding, 2);
  CHECK_FALSE(DecodeCallResults(OneResult(encoding)).has_value());
  std::string unknown;  // a field CallResult does not have
  AppendTag(unknown, 7, 0);
  AppendVarint(unknown, 1);
  CHECK_FALSE(DecodeCallResults(OneResult(unknown)).has_value());
  std::string wrong_type;  // call_id as a varint
  AppendTag(wrong_type, 1, 0);
  AppendVarint(wrong_type, 1);
  CHECK_FALSE(DecodeCallResults(OneResult(wrong_type)).has_value());
  std::string bad_utf8;
  AppendBytesField(bad_utf8, 1, "\xff\xfe");
  CHECK_FALSE(DecodeCallResults(OneResult(bad_utf8)).has_value());

  std::string twice;  // `result` twice in one event: protobuf merges them
  AppendBytesField(twice, 2, "");
  AppendBytesField(twice, 2, "");
  std::string merged;
  AppendBytesField(merged, 1, twice);
  CHECK_FALSE(DecodeCallResults(merged).has_value());
  std::string empty_event;  // an event with no kind set
  AppendBytesField(empty_event, 1, "");
  CHECK_FALSE(DecodeCallResults(empty_event).has_value());
  std::string top_unknown = OneResult("");  // an unknown CallsResponse field
  AppendTag(top_unknown, 2, 0);
  AppendVarint(top_unknown, 1);
  CHECK_FALSE(DecodeCallResults(top_unknown).has_value());

  const std::string whole = OneResult(std::string("\x0a\x01x\x1a\x02yz", 7));
  REQUIRE(DecodeCallResults(whole).has_value());
  for (size_t cut = 1; cut < whole.size(); ++cut) {  // every truncation
    CHECK_FALSE(DecodeCallResults(whole.substr(0, cut)).has_value());
  }
}

}  // namespace
}  // namespace agentix::host
