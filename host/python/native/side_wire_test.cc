#include "host/python/native/side_wire.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>

#include "agentix/runtime/v1/runtime.pb.h"
#include "host/python/native/proto_test_bytes.h"

namespace agentix::host {
namespace {

using runtime::v1::Attribute;
using runtime::v1::AttributeValue;
using runtime::v1::LogRecord;
using runtime::v1::LogsResponse;
using runtime::v1::TraceEvent;
using runtime::v1::TracesResponse;

using test_bytes::AppendBytesField;
using test_bytes::AppendTag;
using test_bytes::AppendVarint;

void RequireSameRecord(const LogRecordView& view, const LogRecord& parsed) {
  CHECK(view.seq == parsed.seq());
  CHECK(view.logger == parsed.logger());
  CHECK(view.level == parsed.level());
  CHECK(view.level_name == parsed.level_name());
  CHECK(view.message == parsed.message());
  CHECK(view.time_unix_nanos == parsed.time_unix_nanos());
  CHECK(view.file == parsed.file());
  CHECK(view.line == parsed.line());
  CHECK(view.function == parsed.function());
  CHECK(view.module == parsed.module());
  CHECK(view.exception_text == parsed.exception_text());
  CHECK(view.origin == static_cast<int32_t>(parsed.origin()));
  CHECK(view.worker_id == parsed.worker_id());
  CHECK(view.call_id == parsed.call_id());
  CHECK(view.context == parsed.context());
  CHECK(view.extras == parsed.extras());
  CHECK(view.stack_info == parsed.stack_info());
}

void RequireSameAsProtobuf(const std::string& bytes,
                           const LogsResponseView& view) {
  LogsResponse parsed;
  REQUIRE(parsed.ParseFromString(bytes));
  CHECK(view.instance_id == parsed.instance_id());
  REQUIRE(view.records.size() == static_cast<size_t>(parsed.records_size()));
  for (int i = 0; i < parsed.records_size(); ++i) {
    RequireSameRecord(view.records[static_cast<size_t>(i)], parsed.records(i));
  }
}

void RequireSameAttributes(
    const std::vector<AttributeView>& view,
    const google::protobuf::RepeatedPtrField<Attribute>& parsed) {
  REQUIRE(view.size() == static_cast<size_t>(parsed.size()));
  for (int i = 0; i < parsed.size(); ++i) {
    const AttributeView& got = view[static_cast<size_t>(i)];
    const Attribute& want = parsed.Get(i);
    CHECK(got.key == want.key());
    switch (want.value().value_case()) {
      case AttributeValue::kStringValue:
        CHECK(got.kind == AttributeView::Kind::kString);
        CHECK(got.text == want.value().string_value());
        break;
      case AttributeValue::kBoolValue:
        CHECK(got.kind == AttributeView::Kind::kBool);
        CHECK(got.integer == (want.value().bool_value() ? 1 : 0));
        break;
      case AttributeValue::kIntValue:
        CHECK(got.kind == AttributeView::Kind::kInt);
        CHECK(got.integer == want.value().int_value());
        break;
      case AttributeValue::kDoubleValue: {
        CHECK(got.kind == AttributeView::Kind::kDouble);
        const double wanted = want.value().double_value();
        CHECK(std::memcmp(&got.number, &wanted, sizeof wanted) == 0);
        break;
      }
      case AttributeValue::kBytesValue:
        CHECK(got.kind == AttributeView::Kind::kBytes);
        CHECK(got.text == want.value().bytes_value());
        break;
      case AttributeValue::VALUE_NOT_SET:
        CHECK(got.kind == AttributeView::Kind::kUnset);
        break;
    }
  }
}

void RequireSameAsProtobuf(const std::string& bytes,
                           const TracesResponseView& view) {
  TracesResponse parsed;
  REQUIRE(parsed.ParseFromString(bytes));
  CHECK(view.instance_id == parsed.instance_id());
  REQUIRE(view.events.size() == static_cast<size_t>(parsed.events_size()));
  for (int i = 0; i < parsed.events_size(); ++i) {
    const TraceEventView& got = view.events[static_cast<size_t>(i)];
    const TraceEvent& want = parsed.events(i);
    CHECK(got.seq == want.seq());
    CHECK(got.kind == static_cast<int32_t>(want.kind()));
    CHECK(got.agentix_trace_id == want.agentix_trace_id());
    CHECK(got.agentix_span_id == want.agentix_span_id());
    CHECK(got.agentix_parent_id == want.agentix_parent_id());
    CHECK(got.name == want.name());
    CHECK(got.start_time_unix_nanos == want.start_time_unix_nanos());
    CHECK(got.end_time_unix_nanos == want.end_time_unix_nanos());
    RequireSameAttributes(got.attributes, want.attributes());
    REQUIRE(got.events.size() == static_cast<size_t>(want.events_size()));
    for (int j = 0; j < want.events_size(); ++j) {
      CHECK(got.events[static_cast<size_t>(j)].name == want.events(j).name());
      CHECK(got.events[static_cast<size_t>(j)].time_unix_nanos ==
            want.events(j).time_unix_nanos());
      RequireSameAttributes(got.events[static_cast<size_t>(j)].attributes,
                            want.events(j).attributes());
    }
    CHECK(got.status == static_cast<int32_t>(want.status()));
    CHECK(got.status_description == want.status_description());
    CHECK(got.error_message == want.error_message());
    RequireSameAttributes(got.error_data, want.error_data());
    CHECK(got.call_id == want.call_id());
    CHECK(got.worker_id == want.worker_id());
  }
}

LogsResponse SampleLogs() {
  LogsResponse response;
  response.set_instance_id("d41d8cd98f00b204");
  LogRecord* record = response.add_records();
  record->set_seq(41);
  record->set_logger("bench.side");
  record->set_level(20);
  record->set_level_name("INFO");
  record->set_message("température ✓ 𝄞");
  record->set_time_unix_nanos(1764670000123456789);
  record->set_file("/sandbox/app.py");
  record->set_line(12);
  record->set_function("handler");
  record->set_module("app");
  record->set_origin(runtime::v1::LOG_ORIGIN_LOGGING);
  record->set_worker_id("1a2b3c4d");
  record->set_call_id("call-7");
  record->set_context("sandbox-host-worker-1a2b3c4d");
  record->set_extras(std::string("\x81\xa1k\x00", 4));
  LogRecord* other = response.add_records();
  other->set_seq(42);
  other->set_level(-5);  // any int32
  other->set_line(-1);
  other->set_time_unix_nanos(-7);
  other->set_exception_text("Traceback ...");
  other->set_stack_info("Stack (most recent call last): ...");
  other->set_origin(static_cast<runtime::v1::LogOrigin>(99));  // open enum
  return response;
}

TracesResponse SampleTraces() {
  TracesResponse response;
  response.set_instance_id("d41d8cd98f00b204");
  TraceEvent* start = response.add_events();
  start->set_seq(1);
  start->set_kind(runtime::v1::TRACE_EVENT_KIND_TRACE_START);
  start->set_trace_id(std::string(16, '\x01'));
  start->set_agentix_trace_id("trace_0123456789abcdef0123456789abcdef");
  start->set_name("bench");
  start->set_start_time_unix_nanos(1764670000000000000);
  Attribute* meta = start->add_attributes();
  meta->set_key("user");
  meta->mutable_value()->set_string_value("ünïcode");
  TraceEvent* end = response.add_events();
  end->set_seq(2);
  end->set_kind(runtime::v1::TRACE_EVENT_KIND_SPAN_END);
  end->set_span_id(std::string(8, '\x02'));
  end->set_parent_span_id(std::string(8, '\x03'));
  end->set_agentix_trace_id("trace_0123456789abcdef0123456789abcdef");
  end->set_agentix_span_id("span_0123456789abcdef01234567");
  end->set_agentix_parent_id("span_76543210fedcba9876543210");
  end->set_name("s");
  end->set_start_time_unix_nanos(1);
  end->set_end_time_unix_nanos(2);
  end->add_attributes()->set_key("unset");
  Attribute* flag = end->add_attributes();
  flag->set_key("flag");
  flag->mutable_value()->set_bool_value(true);
  Attribute* number = end->add_attributes();
  number->set_key("i");
  number->mutable_value()->set_int_value(-9);
  Attribute* ratio = end->add_attributes();
  ratio->set_key("ratio");
  ratio->mutable_value()->set_double_value(-0.25);
  Attribute* blob = end->add_attributes();
  blob->set_key("blob");
  blob->mutable_value()->set_bytes_value(std::string("\xff\x00", 2));
  auto* event = end->add_events();
  event->set_name("retry");
  event->set_time_unix_nanos(3);
  event->add_attributes()->set_key("n");
  end->set_status(runtime::v1::SPAN_STATUS_CODE_ERROR);
  end->set_status_description("failed");
  end->set_error_message("boom");
  Attribute* data = end->add_error_data();
  data->set_key("code");
  data->mutable_value()->set_int_value(7);
  end->set_call_id("call-7");
  end->set_worker_id("1a2b3c4d");
  return response;
}

TEST_CASE("Logs and traces responses decode as protobuf reads them",
          "[side_wire]") {
  const std::string logs = SampleLogs().SerializeAsString();
  auto records = DecodeLogsResponse(logs);
  REQUIRE(records.has_value());
  REQUIRE(records->records.size() == 2);
  CHECK(records->records[0].message == "température ✓ 𝄞");
  CHECK(records->records[1].origin == 99);
  RequireSameAsProtobuf(logs, *records);

  const std::string traces = SampleTraces().SerializeAsString();
  auto events = DecodeTracesResponse(traces);
  REQUIRE(events.has_value());
  REQUIRE(events->events.size() == 2);
  CHECK(events->events[1].attributes.size() == 5);
  CHECK(events->events[1].attributes[0].kind == AttributeView::Kind::kUnset);
  RequireSameAsProtobuf(traces, *events);

  auto empty = DecodeLogsResponse("");
  REQUIRE(empty.has_value());
  CHECK(empty->records.empty());
  CHECK(empty->instance_id.empty());
}

TEST_CASE("Decoding into a reused view leaves nothing of the previous response",
          "[side_wire]") {
  // The host decodes every response into one view per thread (its items'
  // capacity kept): a smaller response after a larger one must not show
  // the larger one's records or instance id.
  TracesResponse big = SampleTraces();
  big.set_instance_id("instance-a");
  for (int i = 0; i < 40; ++i) *big.add_events() = big.events(i % 2);
  const std::string big_bytes = big.SerializeAsString();
  TracesResponse small = SampleTraces();
  small.mutable_events()->DeleteSubrange(1, 1);
  small.clear_instance_id();
  const std::string small_bytes = small.SerializeAsString();

  TracesResponseView view;
  REQUIRE(DecodeTracesResponseInto(big_bytes, &view));
  REQUIRE(view.events.size() == 42);
  CHECK(view.instance_id == "instance-a");
  REQUIRE(DecodeTracesResponseInto(small_bytes, &view));
  REQUIRE(view.events.size() == 1);
  CHECK(view.instance_id.empty());
  RequireSameAsProtobuf(small_bytes, view);

  LogsResponse logs = SampleLogs();
  logs.set_instance_id("instance-b");
  const std::string logs_bytes = logs.SerializeAsString();
  LogsResponseView records;
  REQUIRE(DecodeLogsResponseInto(logs_bytes, &records));
  REQUIRE(DecodeLogsResponseInto("", &records));
  CHECK(records.records.empty());
  CHECK(records.instance_id.empty());
  // A response the decoder leaves to protobuf says so the same way.
  CHECK_FALSE(DecodeLogsResponseInto(logs_bytes.substr(0, logs_bytes.size() - 1), &records));
}

TEST_CASE("Repeated scalars keep the last value and message fields merge",
          "[side_wire]") {
  std::string record;
  AppendTag(record, 1, 0);
  AppendVarint(record, 5);
  AppendBytesField(record, 2, "first");
  AppendTag(record, 3, 0);
  AppendVarint(record, 0xFFFFFFFF00000014);  // int32: the low 32 bits, 20
  AppendTag(record, 40, 5);                  // unknown fixed32
  record.append(4, '\x01');
  AppendBytesField(record, 2, "second");
  AppendBytesField(record, 99, "\xff not UTF-8, unknown");
  AppendTag(record, 1, 0);
  AppendVarint(record, 6);
  std::string logs;
  AppendBytesField(logs, 1, record);
  AppendBytesField(logs, 2, "instance");
  auto decoded = DecodeLogsResponse(logs);
  REQUIRE(decoded.has_value());
  CHECK(decoded->records[0].seq == 6);
  CHECK(decoded->records[0].logger == "second");
  CHECK(decoded->records[0].level == 20);
  RequireSameAsProtobuf(logs, *decoded);

  // An Attribute whose value is given three times: a string, then an
  // empty AttributeValue (changes nothing), then an int (replaces it).
  std::string string_value, int_value;
  AppendBytesField(string_value, 1, "text");
  AppendTag(int_value, 3, 0);
  AppendVarint(int_value, 11);
  std::string attribute;
  AppendBytesField(attribute, 1, "k");
  AppendBytesField(attribute, 2, string_value);
  AppendBytesField(attribute, 2, "");
  std::string event;
  AppendBytesField(event, 12, attribute);
  AppendBytesField(attribute, 2, int_value);
  AppendBytesField(event, 12, attribute);
  std::string traces;
  AppendBytesField(traces, 1, event);
  auto events = DecodeTracesResponse(traces);
  REQUIRE(events.has_value());
  REQUIRE(events->events[0].attributes.size() == 2);
  CHECK(events->events[0].attributes[0].kind == AttributeView::Kind::kString);
  CHECK(events->events[0].attributes[1].kind == AttributeView::Kind::kInt);
  CHECK(events->events[0].attributes[1].integer == 11);
  RequireSameAsProtobuf(traces, *events);
}

// Every prefix, and `rounds` random damages (byte changes, insertions,
// cuts) of `valid`: each is decoded only when protobuf reads the same.
template <typename Decode>
void CheckDamaged(const std::string& valid, Decode decode, int rounds) {
  int decoded = 0;
  int refused = 0;
  auto check = [&](const std::string& bytes) {
    auto view = decode(bytes);
    if (view) {
      ++decoded;
      RequireSameAsProtobuf(bytes, *view);
    } else {
      ++refused;
    }
  };
  for (size_t n = 0; n < valid.size(); ++n) check(valid.substr(0, n));
  std::mt19937 rng(20261202);
  for (int round = 0; round < rounds; ++round) {
    std::string bytes = valid;
    const int changes = 1 + static_cast<int>(rng() % 4);
    for (int c = 0; c < changes; ++c) {
      const uint32_t choice = rng() % 4;
      if (choice < 2 && !bytes.empty()) {
        bytes[rng() % bytes.size()] = static_cast<char>(rng());
      } else if (choice == 2 && !bytes.empty()) {
        bytes.resize(rng() % bytes.size());
      } else {
        bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(rng() % (bytes.size() + 1)),
                     static_cast<char>(rng()));
      }
    }
    check(bytes);
  }
  CHECK(decoded > 100);
  CHECK(refused > 100);
}

TEST_CASE("Damaged responses are decoded as protobuf reads them or left to it",
          "[side_wire]") {
  CheckDamaged(SampleLogs().SerializeAsString(),
               [](const std::string& b) { return DecodeLogsResponse(b); }, 4000);
  CheckDamaged(SampleTraces().SerializeAsString(),
               [](const std::string& b) { return DecodeTracesResponse(b); }, 4000);
}

TEST_CASE("Malformed or doubtful responses are left to protobuf",
          "[side_wire]") {
  SECTION("invalid UTF-8 in a string field, at any depth") {
    LogsResponse bad_message = SampleLogs();
    bad_message.mutable_records(0)->set_message("caf\xc3");
    TracesResponse bad_key = SampleTraces();
    bad_key.mutable_events(1)->mutable_events(0)->mutable_attributes(0)->set_key("\xed\xa0\x80");
    TracesResponse bad_value = SampleTraces();
    bad_value.mutable_events(0)->mutable_attributes(0)->mutable_value()->set_string_value("\xc0\xaf");
    std::string bytes;
    REQUIRE(bad_message.SerializePartialToString(&bytes));
    CHECK_FALSE(DecodeLogsResponse(bytes).has_value());
    CHECK_FALSE(LogsResponse().ParseFromString(bytes));
    for (const TracesResponse* bad : {&bad_key, &bad_value}) {
      REQUIRE(bad->SerializePartialToString(&bytes));
      CHECK_FALSE(DecodeTracesResponse(bytes).has_value());
      CHECK_FALSE(TracesResponse().ParseFromString(bytes));
    }
  }
  SECTION("a known field with another wire type, groups, a length past the end") {
    std::string seq_as_bytes;
    AppendBytesField(seq_as_bytes, 1, "x");
    std::string logs;
    AppendBytesField(logs, 1, seq_as_bytes);
    CHECK_FALSE(DecodeLogsResponse(logs).has_value());
    std::string double_as_varint;
    AppendTag(double_as_varint, 4, 0);
    AppendVarint(double_as_varint, 1);
    std::string attribute, event, traces;
    AppendBytesField(attribute, 2, double_as_varint);
    AppendBytesField(event, 12, attribute);
    AppendBytesField(traces, 1, event);
    CHECK_FALSE(DecodeTracesResponse(traces).has_value());
    std::string group;
    AppendTag(group, 7, 3);
    AppendTag(group, 7, 4);
    CHECK_FALSE(DecodeLogsResponse(group).has_value());
    std::string past_end;
    AppendTag(past_end, 1, 2);
    AppendVarint(past_end, 1000);
    past_end += "short";
    CHECK_FALSE(DecodeTracesResponse(past_end).has_value());
  }
}

}  // namespace
}  // namespace agentix::host
