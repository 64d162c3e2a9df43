#include "sandbox/side_record.h"

#include <catch2/catch.hpp>

#include <string>

#include "agentix/runtime/v1/runtime.pb.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::LogRecord;
using runtime::v1::LogsResponse;
using runtime::v1::TraceEvent;
using runtime::v1::TracesResponse;

TEST_CASE("A buffered record serializes as protobuf serializes the message",
          "[side_record]") {
  LogRecord body;
  body.set_logger("app");
  body.set_message(std::string(300, 'm'));  // a two-byte length
  body.set_call_id("call-1");
  for (const uint64_t seq : {uint64_t{1}, uint64_t{127}, uint64_t{128},
                             uint64_t{1} << 40}) {
    for (const std::string worker : {"", "w1", "0123abcd"}) {
      LogRecordWire record(body.SerializeAsString());
      record.set_seq(seq);
      record.set_worker_id(worker);
      LogRecord want = body;
      want.set_seq(seq);
      want.set_worker_id(worker);
      // seq and worker_id have the lowest numbers but one, in the order
      // protobuf writes them; the body's fields follow.
      LogRecord head;
      head.set_seq(seq);
      head.set_worker_id(worker);
      CHECK(record.SerializeAsString() ==
            head.SerializeAsString() + body.SerializeAsString());
      CHECK(record.ByteSize() == record.SerializeAsString().size());
      LogRecord got;
      REQUIRE(got.ParseFromString(record.SerializeAsString()));
      CHECK(got.SerializeAsString() == want.SerializeAsString());
    }
  }
}

TEST_CASE("A trace event's suffix follows its body; worker_id is field 19",
          "[side_record]") {
  TraceEvent body;
  body.set_name("span");
  TraceEvent ids;
  ids.set_trace_id(std::string(16, '\x01'));
  ids.set_span_id(std::string(8, '\x02'));
  ids.set_parent_span_id(std::string(8, '\x03'));
  const std::string suffix = ids.SerializeAsString();
  REQUIRE(suffix.size() == kOtelIdsBytes);
  TraceEventWire event(body.SerializeAsString(), suffix);
  event.set_seq(9);
  event.set_worker_id("w1");
  CHECK(event.SerializeAsString() ==
        std::string("\x08\x09\x9a\x01\x02w1") + body.SerializeAsString() + suffix);
  TraceEvent got;
  REQUIRE(got.ParseFromString(event.SerializeAsString()));
  CHECK(got.worker_id() == "w1");
  CHECK(got.seq() == 9);
  CHECK(got.span_id() == ids.span_id());
  CHECK(got.name() == "span");
  CHECK(event.body() == body.SerializeAsString());
  CHECK(event.suffix() == suffix);
}

TEST_CASE("A response serializes as LogsResponse / TracesResponse does",
          "[side_record]") {
  LogsResponse want;
  LogsResponseWire response;
  std::vector<LogRecordWire> records;
  for (int i = 0; i < 3; ++i) {
    LogRecord r;
    r.set_message(std::string(i * 100, 'x'));
    LogRecordWire& w = records.emplace_back(r.SerializeAsString());
    w.set_seq(static_cast<uint64_t>(i + 1));
    w.set_worker_id(i == 1 ? "" : "w");
    r.set_seq(w.seq());
    r.set_worker_id(w.worker_id());
    *want.add_records() = r;
  }
  for (const LogRecordWire& w : records) response.records.push_back(&w);
  // The header alone, then with the records.
  LogsResponse header;
  header.set_instance_id("0011aabb");
  response.instance_id = "0011aabb";
  want.set_instance_id("0011aabb");
  // A worker_id serialized before the body's fields is out of protobuf's
  // canonical order (the same fields, parsed alike), so: parsed.
  LogsResponse got;
  REQUIRE(got.ParseFromString(response.SerializeAsString()));
  CHECK(got.SerializeAsString() == want.SerializeAsString());
  CHECK(response.ByteSizeLong() == want.ByteSizeLong());
  CHECK(response.ByteSizeLong() == response.SerializeAsString().size());
  // Without worker ids the order is protobuf's: the same bytes.
  for (LogRecordWire& w : records) w.set_worker_id("");
  for (auto& r : *want.mutable_records()) r.clear_worker_id();
  CHECK(response.SerializeAsString() == want.SerializeAsString());
  response.records.clear();
  CHECK(response.SerializeAsString() == header.SerializeAsString());
  CHECK(response.ByteSizeLong() == header.ByteSizeLong());

  TracesResponseWire traces;
  TracesResponse traces_want;
  CHECK(traces.SerializeAsString().empty());
  TraceEventWire event(std::string("\x32\x01t", 3));  // agentix_trace_id "t"
  event.set_seq(300);
  traces.records.push_back(&event);
  traces_want.add_events()->set_agentix_trace_id("t");
  traces_want.mutable_events(0)->set_seq(300);
  CHECK(traces.SerializeAsString() == traces_want.SerializeAsString());
}

}  // namespace
}  // namespace agentix::sandbox
