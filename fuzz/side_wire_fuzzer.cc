// libFuzzer target for the host's LogsResponse / TracesResponse decoders
// (host/python/native/side_wire.h), checked against protobuf's own parser
// (the generated C++ classes) on every input. The first byte picks the
// message (even: LogsResponse, odd: TracesResponse), the rest is its bytes.
// Whenever the decoder returns a response, protobuf parses the same bytes
// and reads every field the decoder returns with the same value (strings
// byte for byte, attribute values of the same oneof member); the decoder
// never accepts what protobuf refuses. It may refuse what protobuf accepts
// (the host then parses those with protobuf).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "agentix/runtime/v1/runtime.pb.h"
#include "host/python/native/side_wire.h"

namespace {

using agentix::host::AttributeView;
using agentix::runtime::v1::Attribute;
using agentix::runtime::v1::AttributeValue;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "side_wire_fuzzer: %s\n", what);
  std::abort();
}

void Expect(bool same, const char* what) {
  if (!same) Fail(what);
}

void CompareAttributes(const std::vector<AttributeView>& got,
                       const google::protobuf::RepeatedPtrField<Attribute>& want) {
  Expect(got.size() == static_cast<size_t>(want.size()), "attribute count differs");
  for (int i = 0; i < want.size(); ++i) {
    const AttributeView& a = got[static_cast<size_t>(i)];
    const AttributeValue& v = want.Get(i).value();
    Expect(a.key == want.Get(i).key(), "attribute key differs");
    switch (v.value_case()) {
      case AttributeValue::kStringValue:
        Expect(a.kind == AttributeView::Kind::kString && a.text == v.string_value(), "string value differs");
        break;
      case AttributeValue::kBoolValue:
        Expect(a.kind == AttributeView::Kind::kBool && a.integer == (v.bool_value() ? 1 : 0), "bool differs");
        break;
      case AttributeValue::kIntValue:
        Expect(a.kind == AttributeView::Kind::kInt && a.integer == v.int_value(), "int differs");
        break;
      case AttributeValue::kDoubleValue: {
        const double d = v.double_value();
        Expect(a.kind == AttributeView::Kind::kDouble && std::memcmp(&a.number, &d, sizeof d) == 0,
               "double differs");
        break;
      }
      case AttributeValue::kBytesValue:
        Expect(a.kind == AttributeView::Kind::kBytes && a.text == v.bytes_value(), "bytes differ");
        break;
      case AttributeValue::VALUE_NOT_SET:
        Expect(a.kind == AttributeView::Kind::kUnset, "unset value read as set");
        break;
    }
  }
}

void CheckLogs(const std::string& bytes) {
  auto view = agentix::host::DecodeLogsResponse(bytes);
  if (!view) return;
  agentix::runtime::v1::LogsResponse parsed;
  if (!parsed.ParseFromString(bytes)) Fail("decoded a LogsResponse protobuf refuses");
  Expect(view->instance_id == parsed.instance_id(), "instance_id differs");
  Expect(view->records.size() == static_cast<size_t>(parsed.records_size()), "record count differs");
  for (int i = 0; i < parsed.records_size(); ++i) {
    const auto& r = view->records[static_cast<size_t>(i)];
    const auto& p = parsed.records(i);
    Expect(r.seq == p.seq() && r.level == p.level() && r.time_unix_nanos == p.time_unix_nanos() &&
               r.line == p.line() && r.origin == static_cast<int32_t>(p.origin()),
           "a record's number differs");
    Expect(r.logger == p.logger() && r.level_name == p.level_name() && r.message == p.message() &&
               r.file == p.file() && r.function == p.function() && r.module == p.module() &&
               r.exception_text == p.exception_text() && r.worker_id == p.worker_id() &&
               r.call_id == p.call_id() && r.context == p.context() && r.extras == p.extras() &&
               r.stack_info == p.stack_info(),
           "a record's text differs");
  }
}

void CheckTraces(const std::string& bytes) {
  auto view = agentix::host::DecodeTracesResponse(bytes);
  if (!view) return;
  agentix::runtime::v1::TracesResponse parsed;
  if (!parsed.ParseFromString(bytes)) Fail("decoded a TracesResponse protobuf refuses");
  Expect(view->instance_id == parsed.instance_id(), "instance_id differs");
  Expect(view->events.size() == static_cast<size_t>(parsed.events_size()), "event count differs");
  for (int i = 0; i < parsed.events_size(); ++i) {
    const auto& e = view->events[static_cast<size_t>(i)];
    const auto& p = parsed.events(i);
    Expect(e.seq == p.seq() && e.kind == static_cast<int32_t>(p.kind()) &&
               e.start_time_unix_nanos == p.start_time_unix_nanos() &&
               e.end_time_unix_nanos == p.end_time_unix_nanos() && e.status == static_cast<int32_t>(p.status()),
           "an event's number differs");
    Expect(e.agentix_trace_id == p.agentix_trace_id() && e.agentix_span_id == p.agentix_span_id() &&
               e.agentix_parent_id == p.agentix_parent_id() && e.name == p.name() &&
               e.status_description == p.status_description() && e.error_message == p.error_message() &&
               e.call_id == p.call_id() && e.worker_id == p.worker_id(),
           "an event's text differs");
    CompareAttributes(e.attributes, p.attributes());
    CompareAttributes(e.error_data, p.error_data());
    Expect(e.events.size() == static_cast<size_t>(p.events_size()), "span event count differs");
    for (int j = 0; j < p.events_size(); ++j) {
      const auto& se = e.events[static_cast<size_t>(j)];
      Expect(se.name == p.events(j).name() && se.time_unix_nanos == p.events(j).time_unix_nanos(),
             "a span event differs");
      CompareAttributes(se.attributes, p.events(j).attributes());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    CheckLogs(bytes);
  } else {
    CheckTraces(bytes);
  }
  return 0;
}
