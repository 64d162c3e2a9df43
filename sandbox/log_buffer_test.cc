#include "sandbox/log_buffer.h"

#include <catch2/catch.hpp>

#include <deque>
#include <random>
#include <thread>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/unknown_field_set.h>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace agentix::sandbox {
namespace {

class RecordingSubscriber : public LogSubscriber {
 public:
  explicit RecordingSubscriber(std::string client = "")
      : client_(std::move(client)) {}
  const std::string& client_id() const override { return client_; }
  bool Deliver(std::vector<LogRecordPtr> records) override {
    absl::MutexLock lock(&mu_);
    ++offers_;
    if (refuse_) return false;
    for (auto& r : records) got_.push_back(r);
    return true;
  }
  std::vector<LogRecordPtr> got() {
    absl::MutexLock lock(&mu_);
    return got_;
  }
  // Refuses what it is offered from now on (a host that fell behind), or
  // takes it again.
  void Refuse(bool refuse) {
    absl::MutexLock lock(&mu_);
    refuse_ = refuse;
  }
  // How many times the buffer offered it records.
  int offers() {
    absl::MutexLock lock(&mu_);
    return offers_;
  }

 private:
  const std::string client_;
  absl::Mutex mu_;
  std::vector<LogRecordPtr> got_ ABSL_GUARDED_BY(mu_);
  bool refuse_ ABSL_GUARDED_BY(mu_) = false;
  int offers_ ABSL_GUARDED_BY(mu_) = 0;
};

std::vector<std::string> Messages(RecordingSubscriber& sub) {
  std::vector<std::string> out;
  for (const auto& r : sub.got()) out.push_back(FullOf(*r).message());
  return out;
}

LogRecordWire Entry(const std::string& message,
                          const std::string& worker = "w") {
  runtime::v1::LogRecord e;
  e.set_logger("app");
  e.set_message(message);
  e.set_call_id("c1");
  std::string call;
  return ToWireLogRecord(e.SerializeAsString(), worker, &call);
}

TEST_CASE("A worker's record is kept as sent; the daemon owns seq and "
          "worker_id",
          "[logs]") {
  runtime::v1::LogRecord sent;
  sent.set_seq(77);           // not the worker's to choose
  sent.set_worker_id("fake");
  sent.set_logger("app");
  sent.set_level(40);
  sent.set_message("m");
  sent.set_origin(runtime::v1::LOG_ORIGIN_STDERR);
  sent.set_extras(std::string("\x81\xa1k\x01", 4));
  std::string bytes = sent.SerializeAsString();
  // A field from a newer runtime.proto (number 999, a string) rides along
  // untouched as an unknown field.
  bytes += std::string("\xba\x3e\x03new", 6);
  const runtime::v1::LogRecord got = ToLogRecord(bytes, "w1");
  CHECK(got.seq() == 0);
  CHECK(got.worker_id() == "w1");
  runtime::v1::LogRecord want = sent;
  want.clear_seq();
  want.set_worker_id("w1");
  runtime::v1::LogRecord known = got;
  known.GetReflection()->MutableUnknownFields(&known)->Clear();
  CHECK(known.SerializeAsString() == want.SerializeAsString());
  CHECK(got.SerializeAsString().find("new") != std::string::npos);

  // Bytes that are no LogRecord become a warning in the record's place.
  const runtime::v1::LogRecord bad = ToLogRecord("\xff\xff\xff", "w1");
  CHECK(bad.origin() == runtime::v1::LOG_ORIGIN_RUNTIME);
  CHECK(bad.level_name() == "WARNING");
  CHECK(bad.message() ==
        "a log record from the worker could not be decoded (3 bytes)");
  CHECK(bad.worker_id() == "w1");
}

// How often field `number` occurs at the top level of `bytes` (a valid
// message): the daemon's fields must appear once, whoever sent them.
int Occurrences(const std::string& bytes, int number) {
  google::protobuf::io::CodedInputStream in(
      reinterpret_cast<const uint8_t*>(bytes.data()),
      static_cast<int>(bytes.size()));
  google::protobuf::UnknownFieldSet fields;
  REQUIRE(fields.MergeFromCodedStream(&in));
  int n = 0;
  for (int i = 0; i < fields.field_count(); ++i) {
    n += fields.field(i).number() == number;
  }
  return n;
}

TEST_CASE("The daemon forwards a worker's record bytes as sent, with its own "
          "seq and worker_id once",
          "[logs][wire]") {
  runtime::v1::LogRecord sent;
  sent.set_seq(77);  // forged: not the worker's to choose
  sent.set_worker_id("fake");
  sent.set_logger("app.ünï");
  sent.set_level(40);
  sent.set_message("m \xe2\x82\xac \xf0\x9f\x98\x80");  // €, an emoji
  sent.set_call_id("call-1");
  sent.set_extras(std::string("\x81\xa1k\xc4\x02\xff\x00", 7));  // binary
  std::string bytes = sent.SerializeAsString();
  bytes += std::string("\xba\x3e\x03new", 6);  // field 999: rides along
  std::string call;
  LogRecordWire w = ToWireLogRecord(bytes, "w1", &call);
  CHECK(call == "call-1");
  w.set_seq(5);
  const std::string out = w.SerializeAsString();
  CHECK(Occurrences(out, 1) == 1);
  CHECK(Occurrences(out, 13) == 1);
  runtime::v1::LogRecord got;
  REQUIRE(got.ParseFromString(out));
  runtime::v1::LogRecord want = sent;
  want.set_seq(5);
  want.set_worker_id("w1");
  runtime::v1::LogRecord known = got;
  known.GetReflection()->MutableUnknownFields(&known)->Clear();
  CHECK(known.SerializeAsString() == want.SerializeAsString());
  CHECK(out.find(std::string("\xba\x3e\x03new", 6)) != std::string::npos);
  // The worker's bytes are kept, not re-encoded.
  CHECK(out.find(sent.message()) != std::string::npos);
}

TEST_CASE("A worker's trace event is kept as sent, with the daemon's seq, "
          "OpenTelemetry ids and worker_id once each",
          "[traces][wire]") {
  runtime::v1::TraceEvent sent;
  sent.set_kind(runtime::v1::TRACE_EVENT_KIND_SPAN_END);
  sent.set_agentix_trace_id("trace_000102030405060708090a0b0c0d0e0f");
  sent.set_agentix_span_id("span_a0a1a2a3a4a5a6a7a8a9aaab");
  sent.set_agentix_parent_id("span_b0b1b2b3b4b5b6b7b8b9babb");
  sent.set_name("step \xc3\xa9");
  sent.set_end_time_unix_nanos(1764670000000002000);
  sent.set_call_id("call-1");
  auto* a = sent.add_attributes();
  a->set_key("i");
  a->mutable_value()->set_int_value(7);
  runtime::v1::TraceEvent want = sent;
  want.set_seq(5);
  want.set_trace_id(std::string("\x00\x01\x02\x03\x04\x05\x06\x07"
                                "\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f", 16));
  want.set_span_id("\xa0\xa1\xa2\xa3\xa4\xa5\xa6\xa7");
  want.set_parent_span_id("\xb0\xb1\xb2\xb3\xb4\xb5\xb6\xb7");
  want.set_worker_id("w1");
  const std::string extra("\xba\x3e\x03new", 6);  // field 999: rides along
  // As a worker sends it (the fast path), and with the daemon's fields
  // forged (the full parse's path): the same event either way.
  runtime::v1::TraceEvent forged = sent;
  forged.set_seq(99);
  forged.set_trace_id("forged");
  forged.set_span_id("forged");
  forged.set_parent_span_id("forged");
  forged.set_worker_id("forged");
  for (const runtime::v1::TraceEvent* event : {&sent, &forged}) {
    std::string call;
    std::optional<TraceEventWire> w =
        ToWireTraceEvent(event->SerializeAsString() + extra, "", &call);
    REQUIRE(w.has_value());
    CHECK(call == "call-1");
    CHECK(w->seq() == 0);  // the buffer numbers it
    w->set_seq(5);
    w->set_worker_id("w1");  // as OnWorkerFrames sets it
    const std::string out = w->SerializeAsString();
    for (int number : {1, 3, 4, 5, 19}) {
      INFO("field " << number);
      CHECK(Occurrences(out, number) == 1);
    }
    runtime::v1::TraceEvent got;
    REQUIRE(got.ParseFromString(out));
    runtime::v1::TraceEvent known = got;
    known.GetReflection()->MutableUnknownFields(&known)->Clear();
    CHECK(known.SerializeAsString() == want.SerializeAsString());
    CHECK(out.find(extra) != std::string::npos);
    CHECK(w->ByteSize() == out.size());
  }
  // Agentix ids not of the hex form get no OpenTelemetry ids (empty, left
  // out), as before; a top-level span has no parent id.
  runtime::v1::TraceEvent odd;
  odd.set_kind(runtime::v1::TRACE_EVENT_KIND_SPAN_START);
  odd.set_agentix_trace_id("trace_xyz");
  odd.set_agentix_span_id("custom");
  std::string call;
  std::optional<TraceEventWire> w =
      ToWireTraceEvent(odd.SerializeAsString(), "w2", &call);
  REQUIRE(w.has_value());
  const std::string out = w->SerializeAsString();
  for (int number : {3, 4, 5}) CHECK(Occurrences(out, number) == 0);
  const runtime::v1::TraceEvent full = FullOf(*w);
  CHECK(full.agentix_span_id() == "custom");
  CHECK(full.worker_id() == "w2");
}

TEST_CASE("What the daemon keeps as sent is the worker's bytes exactly, "
          "behind seq and worker_id; no worker id is no field",
          "[logs][traces][wire]") {
  runtime::v1::LogRecord sent;
  sent.set_logger("app");
  sent.set_message("m \xe2\x82\xac");
  sent.set_call_id("call-with-a-long-id-0123456789");
  const std::string bytes = sent.SerializeAsString();
  std::string call;
  LogRecordWire w = ToWireLogRecord(bytes, "w1", &call);
  CHECK(call == "call-with-a-long-id-0123456789");
  w.set_seq(5);
  // seq (1) = 5, worker_id (13) = "w1", then the worker's bytes.
  CHECK(w.SerializeAsString() == std::string("\x08\x05\x6a\x02w1") + bytes);
  CHECK(w.ByteSize() == bytes.size() + 6);

  // Serialized as proto3 would: an empty worker id is left out, whether
  // the bytes were kept or (forged worker_id) parsed.
  runtime::v1::LogRecord forged = sent;
  forged.set_worker_id("fake");
  for (const std::string& b : {bytes, forged.SerializeAsString()}) {
    LogRecordWire none = ToWireLogRecord(b, "", &call);
    none.set_seq(7);
    const std::string out = none.SerializeAsString();
    CHECK(Occurrences(out, 13) == 0);
    CHECK(Occurrences(out, 1) == 1);
    none.set_worker_id("w2");
    CHECK(Occurrences(none.SerializeAsString(), 13) == 1);
    none.set_worker_id("");
    CHECK(none.SerializeAsString() == out);
  }

  // A record shorter than a string's inline buffer: the call id is read
  // before the bytes move.
  runtime::v1::LogRecord tiny;
  tiny.set_call_id("c");
  LogRecordWire t = ToWireLogRecord(tiny.SerializeAsString(), "", &call);
  CHECK(call == "c");
  CHECK(t.SerializeAsString() == tiny.SerializeAsString());

  // A trace event: the worker's bytes, then the derived ids, seq and
  // worker_id in front; none when the worker is unknown.
  runtime::v1::TraceEvent event;
  event.set_kind(runtime::v1::TRACE_EVENT_KIND_SPAN_START);
  event.set_agentix_trace_id("trace_000102030405060708090a0b0c0d0e0f");
  event.set_agentix_span_id("span_a0a1a2a3a4a5a6a7a8a9aaab");
  event.set_call_id("c2");
  const std::string event_bytes = event.SerializeAsString();
  std::optional<TraceEventWire> e =
      ToWireTraceEvent(event_bytes, "", &call);
  REQUIRE(e.has_value());
  CHECK(call == "c2");
  e->set_seq(5);
  const std::string ids =
      std::string("\x1a\x10", 2) +
      std::string("\x00\x01\x02\x03\x04\x05\x06\x07"
                  "\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f", 16) +
      "\x22\x08\xa0\xa1\xa2\xa3\xa4\xa5\xa6\xa7";  // no parent: no field 5
  CHECK(e->SerializeAsString() == "\x08\x05" + event_bytes + ids);
  e->set_worker_id("w1");
  CHECK(e->SerializeAsString() ==
        "\x08\x05\x9a\x01\x02w1" + event_bytes + ids);  // 19: 0x9a 0x01
}

TEST_CASE("Record bytes a host could not parse never reach it",
          "[logs][wire]") {
  std::string call;
  // Not UTF-8 in a string field, top level: the full parse refuses it too,
  // so the record becomes the warning, as before.
  runtime::v1::LogRecord bad_text;
  bad_text.set_logger("app");
  bad_text.set_message("ok");
  std::string bytes = bad_text.SerializeAsString();
  bytes.replace(bytes.find("ok"), 2, "\xc0\xaf");  // an overlong '/'
  runtime::v1::LogRecord got = FullOf(ToWireLogRecord(bytes, "w1", &call));
  CHECK(got.origin() == runtime::v1::LOG_ORIGIN_RUNTIME);
  CHECK(got.message().find("could not be decoded") != std::string::npos);
  // A surrogate (CESU-style) and a truncated sequence likewise.
  for (const std::string& text :
       {std::string("\xed\xa0\x80"), std::string("a\xe2\x82")}) {
    runtime::v1::LogRecord r;
    r.set_message("zzz");
    std::string b = r.SerializeAsString();
    b.replace(b.find("zzz"), 3, text.size() == 3 ? text : text + "z");
    got = FullOf(ToWireLogRecord(b, "w1", &call));
    CHECK(got.origin() == runtime::v1::LOG_ORIGIN_RUNTIME);
  }
  // A length past the end.
  got = FullOf(
      ToWireLogRecord(std::string("\x2a\x10" "short", 7), "w1", &call));
  CHECK(got.origin() == runtime::v1::LOG_ORIGIN_RUNTIME);
  // An (empty) group: not what a worker sends, so not checked fast; the
  // full parse keeps it as an unknown field, as before.
  runtime::v1::LogRecord grouped;
  grouped.set_message("g");
  got = FullOf(ToWireLogRecord(grouped.SerializeAsString() + "\x2b\x2c",
                               "w1", &call));
  CHECK(got.message() == "g");
  // Not UTF-8 inside an attribute of a trace event (nested twice): refused,
  // as the full parse refuses it.
  runtime::v1::TraceEvent event;
  event.set_agentix_span_id("span_a0a1a2a3a4a5a6a7a8a9aaab");
  auto* a = event.add_attributes();
  a->set_key("k");
  a->mutable_value()->set_string_value("vv");
  std::string e = event.SerializeAsString();
  e.replace(e.find("vv"), 2, "\xff\xfe");
  CHECK_FALSE(ToWireTraceEvent(e, "w1", &call).has_value());
  // The same with valid text passes, OpenTelemetry ids derived.
  event.set_call_id("c9");
  auto ok = ToWireTraceEvent(event.SerializeAsString(), "w1", &call);
  REQUIRE(ok.has_value());
  CHECK(call == "c9");
  const runtime::v1::TraceEvent full = FullOf(*ok);
  CHECK(full.span_id().size() == 8);
  CHECK(full.attributes(0).value().string_value() == "vv");
  CHECK(full.worker_id() == "w1");
}

TEST_CASE("Whatever bytes a worker sends, what the daemon keeps parses",
          "[logs][wire]") {
  // Random damage to real records: every kept record (and every kept trace
  // event) must parse as the host parses it; refusals are the full parse's.
  runtime::v1::LogRecord r;
  r.set_logger("bench.side");
  r.set_level(20);
  r.set_level_name("INFO");
  r.set_message("side-channel record 12345 \xc3\xa9");
  r.set_file("/x/side_targets.py");
  r.set_call_id("0123456789abcdef0123456789abcdef");
  r.set_extras(std::string("\x81\xa1k\x01", 4));
  runtime::v1::TraceEvent t;
  t.set_kind(runtime::v1::TRACE_EVENT_KIND_SPAN_END);
  t.set_agentix_trace_id("trace_000102030405060708090a0b0c0d0e0f");
  t.set_name("s");
  auto* a = t.add_attributes();
  a->set_key("i");
  a->mutable_value()->set_string_value("\xc3\xa9t\xc3\xa9");
  auto* ev = t.add_events();
  ev->set_name("e");
  ev->add_attributes()->set_key("k");
  const std::string log_bytes = r.SerializeAsString();
  const std::string trace_bytes = t.SerializeAsString();
  std::mt19937 rng(25);
  std::string call;
  for (int i = 0; i < 4000; ++i) {
    const std::string& base = i % 2 ? trace_bytes : log_bytes;
    std::string b = base;
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
      const size_t at = rng() % b.size();
      switch (rng() % 3) {
        case 0: b[at] = static_cast<char>(rng()); break;
        case 1: b.erase(at, 1 + rng() % 4); break;
        default: b.insert(at, 1, static_cast<char>(rng())); break;
      }
      if (b.empty()) b = "x";
    }
    if (i % 2) {
      auto w = ToWireTraceEvent(b, "w1", &call);
      if (!w.has_value()) continue;
      runtime::v1::TraceEvent parsed;
      REQUIRE(parsed.ParseFromString(w->SerializeAsString()));
    } else {
      runtime::v1::LogRecord parsed;
      REQUIRE(parsed.ParseFromString(
          ToWireLogRecord(b, "w1", &call).SerializeAsString()));
    }
  }
}

TEST_CASE("Records before any subscriber are buffered and replayed in order",
          "[logs]") {
  auto owned = MakeLogBuffer(100);
  LogBuffer& buffer = *owned;
  buffer.Append({Entry("one", "w1")});
  buffer.Append({Entry("two", "w1")});
  auto sub = std::make_shared<RecordingSubscriber>();
  REQUIRE(buffer.Subscribe(sub, 0).ok());
  buffer.Append({Entry("three", "w2")});
  auto got = sub->got();
  REQUIRE(got.size() == 3);
  REQUIRE(FullOf(*got[0]).message() == "one");
  REQUIRE(got[0]->seq() == 1);
  REQUIRE(FullOf(*got[0]).worker_id() == "w1");
  REQUIRE(FullOf(*got[0]).call_id() == "c1");
  REQUIRE(FullOf(*got[2]).message() == "three");
  REQUIRE(got[2]->seq() == 3);
  REQUIRE(FullOf(*got[2]).worker_id() == "w2");
}

TEST_CASE("Resubscribing after a seq skips what was seen; acks free space",
          "[logs]") {
  auto owned = MakeLogBuffer(100);
  LogBuffer& buffer = *owned;
  for (const char* m : {"a", "b", "c"}) buffer.Append({Entry(m)});
  auto sub = std::make_shared<RecordingSubscriber>();
  REQUIRE(buffer.Subscribe(sub, 2).ok());
  REQUIRE(sub->got().size() == 1);
  REQUIRE(FullOf(*sub->got()[0]).message() == "c");
  buffer.Ack(2);
  REQUIRE(buffer.buffered() == 1);
  buffer.Unsubscribe(sub.get());
  buffer.Append({Entry("d")});
  REQUIRE(sub->got().size() == 1);  // unsubscribed: nothing more

  // A cursor from another daemon instance does not skip anything here.
  auto other = std::make_shared<RecordingSubscriber>();
  REQUIRE(buffer.Subscribe(other, 3, "not-this-daemon").ok());
  // A new client gets what nobody received ("d"), not "c" again.
  REQUIRE(other->got().size() == 1);
  auto same = std::make_shared<RecordingSubscriber>();
  REQUIRE(buffer.Subscribe(same, 3, buffer.instance_id()).ok());
  REQUIRE(same->got().size() == 1);  // "d"
  REQUIRE(buffer.instance_id().size() == 16);
}

TEST_CASE("Overflow drops the oldest and says so in one warning record",
          "[logs]") {
  auto owned = MakeLogBuffer(3);
  LogBuffer& buffer = *owned;
  for (int i = 0; i < 10; ++i) buffer.Append({Entry(std::to_string(i))});
  REQUIRE(buffer.dropped_total() == 7);
  auto sub = std::make_shared<RecordingSubscriber>();
  REQUIRE(buffer.Subscribe(sub, 0).ok());
  auto got = sub->got();
  // "7", "8", "9" and the warning: storing the warning evicts "7", but only
  // after it was handed to this subscriber, so it is not lost.
  REQUIRE(got.size() == 4);
  REQUIRE(FullOf(*got[0]).message() == "7");
  REQUIRE(FullOf(*got[2]).message() == "9");
  REQUIRE(FullOf(*got[3]).level_name() == "WARNING");
  REQUIRE(FullOf(*got[3]).origin() == runtime::v1::LOG_ORIGIN_RUNTIME);
  REQUIRE(FullOf(*got[3]).message().find(
              "7 sandbox log records were dropped") == 0);
  // Seqs stay increasing across the warning.
  REQUIRE(got[3]->seq() > got[2]->seq());
}

TEST_CASE("Evicting records a connected host already got is not a drop",
          "[logs]") {
  // Acks trail deliveries during a burst; the backlog only exists for
  // replay after a reconnect.
  auto owned = MakeLogBuffer(3);
  LogBuffer& buffer = *owned;
  auto sub = std::make_shared<RecordingSubscriber>();
  REQUIRE(buffer.Subscribe(sub, 0).ok());
  for (int i = 0; i < 100; ++i) buffer.Append({Entry(std::to_string(i))});
  auto got = sub->got();
  REQUIRE(got.size() == 100);
  for (const auto& r : got) REQUIRE(FullOf(*r).level_name() != "WARNING");
  REQUIRE(buffer.dropped_total() == 0);
  REQUIRE(buffer.buffered() == 3);
}

TEST_CASE("A resuming host is told how many records it can no longer get",
          "[logs]") {
  auto owned = MakeLogBuffer(3);
  LogBuffer& buffer = *owned;
  auto first = std::make_shared<RecordingSubscriber>();
  REQUIRE(buffer.Subscribe(first, 0).ok());
  for (int i = 1; i <= 10; ++i) buffer.Append({Entry(std::to_string(i))});
  buffer.Unsubscribe(first.get());
  // The host had received up to seq 4 when its stream broke; 5..7 were
  // evicted meanwhile (delivered on the broken stream, never acknowledged).
  auto resumed = std::make_shared<RecordingSubscriber>();
  REQUIRE(buffer.Subscribe(resumed, 4, buffer.instance_id()).ok());
  auto got = resumed->got();
  REQUIRE(got.size() == 4);
  REQUIRE(FullOf(*got[0]).message() == "8");
  REQUIRE(FullOf(*got[2]).message() == "10");
  REQUIRE(FullOf(*got[3]).level_name() == "WARNING");
  REQUIRE(FullOf(*got[3]).message().find(
              "3 sandbox log records were dropped") == 0);

  // A host that is up to date misses nothing and hears no warning.
  auto current = std::make_shared<RecordingSubscriber>();
  REQUIRE(buffer.Subscribe(current, got[3]->seq(), buffer.instance_id()).ok());
  REQUIRE(current->got().empty());
}

TEST_CASE("Every subscriber gets every record", "[logs]") {
  auto owned = MakeLogBuffer(10);
  LogBuffer& buffer = *owned;
  auto a = std::make_shared<RecordingSubscriber>();
  auto b = std::make_shared<RecordingSubscriber>();
  REQUIRE(buffer.Subscribe(a, 0).ok());
  REQUIRE(buffer.Subscribe(b, 0).ok());
  buffer.Append({Entry("x"), Entry("y")});
  REQUIRE(a->got().size() == 2);
  REQUIRE(b->got().size() == 2);
}

TEST_CASE("A subscriber that falls behind is paused and caught up from the "
          "buffer, each record once, in order",
          "[logs]") {
  auto owned = MakeLogBuffer(100);
  LogBuffer& buffer = *owned;
  auto lagging = std::make_shared<RecordingSubscriber>();
  auto other = std::make_shared<RecordingSubscriber>();
  REQUIRE(buffer.Subscribe(lagging, 0).ok());
  REQUIRE(buffer.Subscribe(other, 0).ok());
  buffer.Append({Entry("1"), Entry("2")});
  lagging->Refuse(true);  // its stream holds as much unwritten as it may
  buffer.Append({Entry("3")});
  REQUIRE(buffer.paused(lagging.get()));
  const int offers = lagging->offers();
  buffer.Append({Entry("4"), Entry("5")});
  // Paused: not offered the new records at all; the other host gets them.
  REQUIRE(lagging->offers() == offers);
  REQUIRE(Messages(*other) == std::vector<std::string>{"1", "2", "3", "4", "5"});
  // The other host's ack frees nothing the paused one has yet to get.
  buffer.Ack(5);
  lagging->Refuse(false);
  buffer.Resume(lagging);
  REQUIRE_FALSE(buffer.paused(lagging.get()));
  buffer.Append({Entry("6")});
  REQUIRE(Messages(*lagging) ==
          std::vector<std::string>{"1", "2", "3", "4", "5", "6"});
  REQUIRE(buffer.dropped_total() == 0);
  // Once it has them, acks free them again.
  buffer.Ack(6);
  REQUIRE(buffer.buffered() == 0);
  // Resuming a subscriber that is not paused sends nothing.
  buffer.Resume(lagging);
  REQUIRE(Messages(*lagging).size() == 6);
}

TEST_CASE("A paused subscriber is told how many of its records the buffer "
          "evicted before it resumed",
          "[logs]") {
  auto owned = MakeLogBuffer(4);
  LogBuffer& buffer = *owned;
  auto lagging = std::make_shared<RecordingSubscriber>();
  REQUIRE(buffer.Subscribe(lagging, 0).ok());
  buffer.Append({Entry("1")});
  lagging->Refuse(true);
  for (int i = 2; i <= 10; ++i) buffer.Append({Entry(std::to_string(i))});
  lagging->Refuse(false);
  buffer.Resume(lagging);
  const std::vector<std::string> got = Messages(*lagging);
  // 1, then what the buffer still held of 2..10, then the report counting
  // 2..6: none twice, none out of order, the rest counted.
  REQUIRE(got.size() == 6);
  REQUIRE(got[0] == "1");
  REQUIRE(got[1] == "7");
  REQUIRE(got[4] == "10");
  REQUIRE(got[5].find("5 sandbox log records were dropped") == 0);
  auto records = lagging->got();
  for (size_t i = 1; i < records.size(); ++i) {
    REQUIRE(records[i]->seq() > records[i - 1]->seq());
  }
}

TEST_CASE("A subscriber that refuses its catch-up stays paused from the "
          "same record",
          "[logs]") {
  auto owned = MakeLogBuffer(100);
  LogBuffer& buffer = *owned;
  auto lagging = std::make_shared<RecordingSubscriber>();
  REQUIRE(buffer.Subscribe(lagging, 0).ok());
  buffer.Append({Entry("1")});
  lagging->Refuse(true);
  buffer.Append({Entry("2")});
  buffer.Resume(lagging);  // still backlogged: refuses again
  REQUIRE(buffer.paused(lagging.get()));
  buffer.Append({Entry("3")});
  lagging->Refuse(false);
  buffer.Resume(lagging);
  REQUIRE(Messages(*lagging) == std::vector<std::string>{"1", "2", "3"});
  // Unsubscribing a paused subscriber lets acks free its records.
  lagging->Refuse(true);
  buffer.Append({Entry("4")});
  REQUIRE(buffer.paused(lagging.get()));
  buffer.Unsubscribe(lagging.get());
  buffer.Ack(4);
  REQUIRE(buffer.buffered() == 0);
}

TEST_CASE("Subscribers are bounded; a refused one gets nothing", "[logs]") {
  auto owned = MakeLogBuffer(10);
  LogBuffer& buffer = *owned;
  buffer.SetMaxSubscribers(2);
  buffer.Append({Entry("backlog")});
  auto a = std::make_shared<RecordingSubscriber>();
  auto b = std::make_shared<RecordingSubscriber>();
  auto c = std::make_shared<RecordingSubscriber>();
  REQUIRE(buffer.Subscribe(a, 0).ok());
  REQUIRE(buffer.Subscribe(b, 0).ok());
  absl::Status refused = buffer.Subscribe(c, 0);
  REQUIRE(refused.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(refused.message().find("--max-log-subscribers") !=
          std::string::npos);
  buffer.Append({Entry("live")});
  REQUIRE(c->got().empty());
  REQUIRE(a->got().size() == 2);
  // A departed subscriber frees its place.
  buffer.Unsubscribe(a.get());
  REQUIRE(buffer.Subscribe(c, 0).ok());
}

TEST_CASE("Trace events carry OpenTelemetry ids; their drops go to the logs",
          "[traces]") {
  auto logs = MakeLogBuffer(100);
  auto traces = MakeTraceBuffer(2, logs.get());
  // As the worker sends it: the agentix ids, attributes already typed,
  // and a field of a newer runtime.proto (number 100) this daemon does not
  // know; the daemon's own fields are cleared or overwritten.
  runtime::v1::TraceEvent sent;
  sent.set_seq(99);
  sent.set_kind(runtime::v1::TRACE_EVENT_KIND_SPAN_END);
  sent.set_span_id("forged");
  sent.set_worker_id("forged");
  sent.set_agentix_trace_id("trace_000102030405060708090a0b0c0d0e0f");
  sent.set_agentix_span_id("span_a0a1a2a3a4a5a6a7a8a9aaab");
  sent.set_name("step");
  auto* n = sent.add_attributes();
  n->set_key("n");
  n->mutable_value()->set_int_value(7);
  std::string bytes = sent.SerializeAsString();
  bytes.append("\xa2\x06\x03new", 6);  // field 100, length 3: "new"
  std::optional<runtime::v1::TraceEvent> parsed = ToTraceEvent(bytes, "w1");
  REQUIRE(parsed.has_value());
  const runtime::v1::TraceEvent& e = *parsed;
  REQUIRE(e.seq() == 0);
  REQUIRE(e.trace_id() == std::string("\x00\x01\x02\x03\x04\x05\x06\x07"
                                      "\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f",
                                      16));
  REQUIRE(e.span_id().size() == 8);
  REQUIRE(static_cast<unsigned char>(e.span_id()[0]) == 0xa0);
  REQUIRE(e.parent_span_id().empty());
  REQUIRE(e.agentix_span_id() == sent.agentix_span_id());
  REQUIRE(e.attributes_size() == 1);
  REQUIRE(e.attributes(0).value().int_value() == 7);
  REQUIRE(e.worker_id() == "w1");
  // The unknown field reaches the host as sent.
  REQUIRE(e.SerializeAsString().find(std::string("\xa2\x06\x03new", 6)) !=
          std::string::npos);
  // Bytes that are not a TraceEvent are refused (the session manager
  // reports them on the Logs stream).
  REQUIRE_FALSE(ToTraceEvent(std::string("\x0a\x05" "ab", 4), "w1").has_value());

  for (int i = 0; i < 5; ++i) traces->Append({WireOf(e)});
  auto log_sub = std::make_shared<RecordingSubscriber>();
  REQUIRE(logs->Subscribe(log_sub, 0).ok());
  class TraceSink : public TraceSubscriber {
   public:
    bool Deliver(std::vector<TraceEventPtr> events) override {
      count += events.size();
      return true;
    }
    size_t count = 0;
  };
  auto trace_sub = std::make_shared<TraceSink>();
  REQUIRE(traces->Subscribe(trace_sub, 0).ok());
  REQUIRE(trace_sub->count == 2);
  auto got = log_sub->got();
  REQUIRE(got.size() == 1);
  REQUIRE(FullOf(*got[0]).message().find(
              "3 sandbox trace events were dropped") == 0);
}

}  // namespace
}  // namespace agentix::sandbox

namespace agentix::sandbox {
namespace {

TEST_CASE("A call's records go to its client only; others to every client",
          "[logs]") {
  auto owned = MakeLogBuffer(100);
  LogBuffer& buffer = *owned;
  auto a = std::make_shared<RecordingSubscriber>("client-a");
  auto b = std::make_shared<RecordingSubscriber>("client-b");
  REQUIRE(buffer.Subscribe(a, 0).ok());
  REQUIRE(buffer.Subscribe(b, 0).ok());
  buffer.Append({Entry("of-a"), Entry("of-b"), Entry("of-none")},
                {"client-a", "client-b", ""});
  REQUIRE(Messages(*a) == std::vector<std::string>{"of-a", "of-none"});
  REQUIRE(Messages(*b) == std::vector<std::string>{"of-b", "of-none"});
  // A record of client c's call waits for c, even when others acknowledge.
  buffer.Append({Entry("of-c")}, {"client-c"});
  buffer.Ack(100);
  REQUIRE(buffer.buffered() == 1);
  auto c = std::make_shared<RecordingSubscriber>("client-c");
  REQUIRE(buffer.Subscribe(c, 0).ok());
  REQUIRE(Messages(*c) == std::vector<std::string>{"of-c"});
  REQUIRE(Messages(*a).size() == 2);
}

TEST_CASE("Owners given as runs route each record as owners given one by one",
          "[logs]") {
  std::vector<IdRun> runs;
  for (const char* id : {"client-a", "client-a", "", "client-b", "client-b",
                         "client-b", "client-a"}) {
    AddToRuns(runs, id);
  }
  REQUIRE(runs.size() == 4);
  CHECK(runs[0].id == "client-a");
  CHECK(runs[0].count == 2);
  CHECK(runs[1].id.empty());
  CHECK(runs[2].count == 3);
  CHECK(runs[3].count == 1);

  auto owned = MakeLogBuffer(100);
  LogBuffer& buffer = *owned;
  auto a = std::make_shared<RecordingSubscriber>("client-a");
  auto b = std::make_shared<RecordingSubscriber>("client-b");
  REQUIRE(buffer.Subscribe(a, 0).ok());
  REQUIRE(buffer.Subscribe(b, 0).ok());
  std::vector<LogRecordWire> records;
  for (const char* m : {"a1", "a2", "none", "b1", "b2", "b3", "a3",
                        "past-the-runs"}) {
    records.push_back(Entry(m));
  }
  // Runs covering fewer records than given: the rest have no owner.
  CHECK(buffer.AppendRuns(std::move(records), runs) == 1);
  CHECK(Messages(*a) == std::vector<std::string>{"a1", "a2", "none", "a3",
                                                 "past-the-runs"});
  CHECK(Messages(*b) == std::vector<std::string>{"none", "b1", "b2", "b3",
                                                 "past-the-runs"});
  // A run of a client with no stream yet waits for it past acks; the
  // others' records are freed.
  CHECK(buffer.AppendRuns({Entry("c1"), Entry("c2")}, {{"client-c", 2}}) ==
        9);
  buffer.Ack(100);
  CHECK(buffer.buffered() == 2);
  auto c = std::make_shared<RecordingSubscriber>("client-c");
  REQUIRE(buffer.Subscribe(c, 0).ok());
  CHECK(Messages(*c) == std::vector<std::string>{"c1", "c2"});
  buffer.Ack(100);
  CHECK(buffer.buffered() == 0);
}

TEST_CASE("An ack keeps, in order, the records waiting for their owner among "
          "those it frees",
          "[logs]") {
  auto owned = MakeLogBuffer(100);
  LogBuffer& buffer = *owned;
  auto a = std::make_shared<RecordingSubscriber>("client-a");
  REQUIRE(buffer.Subscribe(a, 0).ok());
  // client-c has no stream yet: its records wait, between records that
  // client-a received and its ack frees.
  CHECK(buffer.AppendRuns({Entry("c1"), Entry("x"), Entry("c2"), Entry("c3"),
                           Entry("y"), Entry("c4")},
                          {{"client-c", 1}, {"", 1}, {"client-c", 2},
                           {"", 1}, {"client-c", 1}}) == 1);
  CHECK(Messages(*a) == std::vector<std::string>{"x", "y"});
  buffer.Ack(5);  // up to "y": c4 (seq 6) is past the ack
  CHECK(buffer.buffered() == 4);
  auto c = std::make_shared<RecordingSubscriber>("client-c");
  REQUIRE(buffer.Subscribe(c, 0).ok());
  CHECK(Messages(*c) == std::vector<std::string>{"c1", "c2", "c3", "c4"});
  buffer.Ack(100);
  CHECK(buffer.buffered() == 0);
}

TEST_CASE("Records of no call kept while nobody listens go to one client once",
          "[logs]") {
  auto owned = MakeLogBuffer(100);
  LogBuffer& buffer = *owned;
  buffer.Append({Entry("kept-1"), Entry("kept-2")});
  buffer.Append({Entry("of-gone")}, {"client-gone"});
  auto first = std::make_shared<RecordingSubscriber>("client-1");
  REQUIRE(buffer.Subscribe(first, 0).ok());
  REQUIRE(Messages(*first) == std::vector<std::string>{"kept-1", "kept-2"});
  auto second = std::make_shared<RecordingSubscriber>("client-2");
  REQUIRE(buffer.Subscribe(second, 0).ok());
  REQUIRE(second->got().empty());
  // The first client, resuming after "kept-1", gets "kept-2" again.
  auto resumed = std::make_shared<RecordingSubscriber>("client-1");
  REQUIRE(buffer.Subscribe(resumed, first->got()[0]->seq()).ok());
  REQUIRE(Messages(*resumed) == std::vector<std::string>{"kept-2"});
}

}  // namespace
// A subscriber during whose first Deliver another thread appends (the worker
// emitting a call's records right then), given `kRaceWindow` to get through
// before that first batch is recorded. It records in arrival order, as the
// stream's write queue does.
constexpr absl::Duration kRaceWindow = absl::Milliseconds(500);

class RacedSubscriber : public LogSubscriber {
 public:
  RacedSubscriber(LogBuffer* buffer, std::string client)
      : buffer_(buffer), client_(std::move(client)) {}
  ~RacedSubscriber() override {
    if (racer_.joinable()) racer_.join();
  }
  const std::string& client_id() const override { return client_; }
  bool Deliver(std::vector<LogRecordPtr> records) override {
    bool first;
    {
      absl::MutexLock lock(&mu_);
      first = !started_;
      started_ = true;
    }
    if (first) {
      racer_ = std::thread([this] {
        buffer_->Append({Entry("live")}, {client_});
        appended_.Notify();
      });
      appended_.WaitForNotificationWithTimeout(kRaceWindow);
    }
    absl::MutexLock lock(&mu_);
    for (auto& r : records) got_.push_back(r);
    return true;
  }
  void Join() {
    if (racer_.joinable()) racer_.join();
  }
  // What a host replays from what arrived: it skips every seq at or below
  // the last one it replayed (a resumed stream's duplicates).
  std::vector<std::string> Replayed() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    uint64_t last = 0;
    for (const auto& r : got_) {
      if (r->seq() <= last) continue;
      last = r->seq();
      out.push_back(FullOf(*r).message());
    }
    return out;
  }

 private:
  LogBuffer* const buffer_;
  const std::string client_;
  absl::Notification appended_;
  std::thread racer_;
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<LogRecordPtr> got_ ABSL_GUARDED_BY(mu_);
};

TEST_CASE("A record appended while a resuming stream takes its backlog "
          "arrives after that backlog",
          "[logs][order]") {
  // The resume race of a connection cut: the host subscribes again while
  // the worker keeps emitting. Arriving first, the new record would make
  // the host skip the whole backlog as already seen.
  auto owned = MakeLogBuffer(100);
  LogBuffer& buffer = *owned;
  buffer.Append({Entry("a"), Entry("b"), Entry("c")}, {"h1", "h1", "h1"});
  auto sub = std::make_shared<RacedSubscriber>(&buffer, "h1");
  REQUIRE(buffer.Subscribe(sub, 0, buffer.instance_id()).ok());
  sub->Join();
  REQUIRE(sub->Replayed() == std::vector<std::string>{"a", "b", "c", "live"});
}

TEST_CASE("Records appended by two threads reach a subscriber in seq order",
          "[logs][order]") {
  // Worker frames and the daemon's own warnings append from different
  // threads: the later seq must not overtake the earlier one.
  auto owned = MakeLogBuffer(100);
  LogBuffer& buffer = *owned;
  auto sub = std::make_shared<RacedSubscriber>(&buffer, "h1");
  REQUIRE(buffer.Subscribe(sub, 0, buffer.instance_id()).ok());
  buffer.Append({Entry("first")}, {"h1"});
  sub->Join();
  REQUIRE(sub->Replayed() == std::vector<std::string>{"first", "live"});
}

}  // namespace agentix::sandbox

namespace agentix::sandbox {
namespace {

// The drop reports among what `sub` got.
std::vector<std::string> DropReports(RecordingSubscriber& sub) {
  std::vector<std::string> out;
  for (const std::string& m : Messages(sub)) {
    if (m.find("were dropped") != std::string::npos) out.push_back(m);
  }
  return out;
}

TEST_CASE("Records a paused host loses are reported to it alone, once, "
          "counting only records it would have got",
          "[logs]") {
  auto owned = MakeLogBuffer(4);
  LogBuffer& buffer = *owned;
  auto lagging = std::make_shared<RecordingSubscriber>("client-a");
  auto other = std::make_shared<RecordingSubscriber>("client-b");
  REQUIRE(buffer.Subscribe(lagging, 0).ok());
  REQUIRE(buffer.Subscribe(other, 0).ok());
  lagging->Refuse(true);
  buffer.Append({Entry("u")});  // seq 1, refused: paused after seq 0
  REQUIRE(buffer.paused(lagging.get()));
  buffer.Append({Entry("b2")}, {"client-b"});
  buffer.Append({Entry("b3")}, {"client-b"});
  // Its own call's records: evicting them evicts u (which it lacks), b2 and
  // b3 (which were never its), then a4 (which nobody got).
  for (int i = 4; i <= 8; ++i) {
    buffer.Append({Entry("a" + std::to_string(i))}, {"client-a"});
  }
  // The other host lost nothing: it is told of no drop.
  REQUIRE(Messages(*other) == std::vector<std::string>{"u", "b2", "b3"});
  lagging->Refuse(false);
  buffer.Resume(lagging);
  // What the buffer holds of its records, then one report counting u and
  // a4 (not b2 and b3, which went to the other client).
  std::vector<std::string> got = Messages(*lagging);
  REQUIRE(got.size() == 5);
  REQUIRE(got[0] == "a5");
  REQUIRE(got[3] == "a8");
  REQUIRE(DropReports(*lagging).size() == 1);
  REQUIRE(got[4].find("2 sandbox log records were dropped") == 0);
  // Later records reach both as before, with no stale report.
  buffer.Append({Entry("after")});
  REQUIRE(Messages(*lagging).back() == "after");
  REQUIRE(Messages(*other).back() == "after");
  REQUIRE(DropReports(*other).empty());
}

TEST_CASE("Two paused hosts of different clients each get their own drop "
          "report only",
          "[logs]") {
  auto owned = MakeLogBuffer(4);
  LogBuffer& buffer = *owned;
  auto a = std::make_shared<RecordingSubscriber>("client-a");
  auto c = std::make_shared<RecordingSubscriber>("client-c");
  REQUIRE(buffer.Subscribe(a, 0).ok());
  REQUIRE(buffer.Subscribe(c, 0).ok());
  a->Refuse(true);
  c->Refuse(true);
  buffer.Append({Entry("u1")});  // both paused after seq 0
  REQUIRE(buffer.paused(a.get()));
  REQUIRE(buffer.paused(c.get()));
  for (int i = 2; i <= 6; ++i) {
    buffer.Append({Entry("a" + std::to_string(i))}, {"client-a"});
  }
  // Evicted: u1 (both lacked it) and a2 (client-a's).
  a->Refuse(false);
  buffer.Resume(a);
  REQUIRE(Messages(*a).size() == 5);
  REQUIRE(DropReports(*a).size() == 1);
  REQUIRE(DropReports(*a)[0].find("2 sandbox log records were dropped") == 0);
  c->Refuse(false);
  buffer.Resume(c);
  // Nothing of client-a's, not a's report: its own report, counting u1.
  REQUIRE(Messages(*c).size() == 1);
  REQUIRE(Messages(*c)[0].find("1 sandbox log records were dropped") == 0);
}

TEST_CASE("A paused Traces host's drop report goes to its own client's Logs "
          "streams",
          "[traces]") {
  auto logs = MakeLogBuffer(100);
  auto traces = MakeTraceBuffer(2, logs.get());
  auto logs_a = std::make_shared<RecordingSubscriber>("client-a");
  auto logs_b = std::make_shared<RecordingSubscriber>("client-b");
  REQUIRE(logs->Subscribe(logs_a, 0).ok());
  REQUIRE(logs->Subscribe(logs_b, 0).ok());
  class TraceSink : public TraceSubscriber {
   public:
    explicit TraceSink(std::string client) : client_(std::move(client)) {}
    const std::string& client_id() const override { return client_; }
    bool Deliver(std::vector<TraceEventPtr> events) override {
      if (refuse) return false;
      count += events.size();
      return true;
    }
    bool refuse = false;
    size_t count = 0;

   private:
    const std::string client_;
  };
  auto traces_a = std::make_shared<TraceSink>("client-a");
  auto traces_b = std::make_shared<TraceSink>("client-b");
  REQUIRE(traces->Subscribe(traces_a, 0).ok());
  REQUIRE(traces->Subscribe(traces_b, 0).ok());
  traces_a->refuse = true;
  runtime::v1::TraceEvent e;
  e.set_name("step");
  for (int i = 0; i < 5; ++i) traces->Append({WireOf(e)});
  // traces_b got all 5; traces_a lost the 3 the buffer (2) evicted.
  REQUIRE(traces_b->count == 5);
  REQUIRE(logs_a->got().empty());
  REQUIRE(logs_b->got().empty());
  traces_a->refuse = false;
  traces->Resume(traces_a);
  REQUIRE(traces_a->count == 2);
  REQUIRE(Messages(*logs_a).size() == 1);
  REQUIRE(Messages(*logs_a)[0].find("3 sandbox trace events were dropped") ==
          0);
  REQUIRE(logs_b->got().empty());
}

TEST_CASE("A host that resubscribes while its paused stream is still open "
          "gets each record once; the old stream holds records only until it "
          "goes",
          "[logs]") {
  auto owned = MakeLogBuffer(4);
  LogBuffer& buffer = *owned;
  auto old_stream = std::make_shared<RecordingSubscriber>("client-a");
  REQUIRE(buffer.Subscribe(old_stream, 0).ok());
  buffer.Append({Entry("r1")}, {"client-a"});
  buffer.Append({Entry("r2")});
  old_stream->Refuse(true);
  buffer.Append({Entry("r3")});  // paused after seq 2
  REQUIRE(buffer.paused(old_stream.get()));
  // The host (its connection cut, say) resubscribes from what it read.
  auto new_stream = std::make_shared<RecordingSubscriber>("client-a");
  REQUIRE(buffer.Subscribe(new_stream, 2, buffer.instance_id()).ok());
  for (int i = 4; i <= 9; ++i) {
    buffer.Append({Entry("r" + std::to_string(i))}, {"client-a"});
  }
  // Every record after its cursor once, in order; nothing was lost to it
  // (the buffer evicted only what it had), so no drop report.
  REQUIRE(Messages(*new_stream) ==
          std::vector<std::string>{"r3", "r4", "r5", "r6", "r7", "r8", "r9"});
  REQUIRE(buffer.dropped_total() == 0);
  // Its acks free nothing the old stream, still paused, has yet to get...
  buffer.Ack(9);
  REQUIRE(buffer.buffered() == 4);
  // ...until that stream goes.
  buffer.Unsubscribe(old_stream.get());
  buffer.Ack(9);
  REQUIRE(buffer.buffered() == 0);
  buffer.Append({Entry("r10")});
  REQUIRE(Messages(*new_stream).back() == "r10");
  REQUIRE(DropReports(*new_stream).empty());
  REQUIRE(Messages(*old_stream) == std::vector<std::string>{"r1", "r2"});
}

// A subscriber shaped like the daemon's stream sink: Deliver queues up to a
// bound and refuses past it; its own thread drains the queue (a host
// reading, at its own pace) and, once below a quarter of the bound after a
// refusal, calls Resume (as OnBacklogCleared does); it acks what it read
// when `acks`.
class DrainedSubscriber
    : public LogSubscriber,
      public std::enable_shared_from_this<DrainedSubscriber> {
 public:
  static constexpr size_t kBound = 64;

  DrainedSubscriber(LogBuffer* buffer, bool acks, unsigned seed)
      : buffer_(buffer), acks_(acks), rng_(seed) {}
  ~DrainedSubscriber() override { Stop(); }

  void Start() {
    drainer_ = std::thread([this] { Drain(); });
  }
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (drainer_.joinable()) drainer_.join();
  }
  bool Deliver(std::vector<LogRecordPtr> records) override {
    absl::MutexLock lock(&mu_);
    if (queue_.size() > kBound) {
      ++refusals_;
      backlogged_ = true;
      return false;
    }
    queue_.insert(queue_.end(), records.begin(), records.end());
    return true;
  }
  // Waits (at most `timeout`) until it has read `n` records.
  std::vector<uint64_t> AwaitSeqs(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&] { return got_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return got_;
  }
  int refusals() {
    absl::MutexLock lock(&mu_);
    return refusals_;
  }

 private:
  void Drain() {
    for (;;) {
      bool cleared = false;
      uint64_t read_to = 0;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [&] { return stop_ || !queue_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (stop_) return;
        // A host reading a message of a few records at a time.
        const size_t n = std::min<size_t>(queue_.size(), 1 + rng_() % 8);
        for (size_t i = 0; i < n; ++i) {
          got_.push_back(queue_.front()->seq());
          queue_.pop_front();
        }
        read_to = got_.back();
        if (backlogged_ && queue_.size() < kBound / 4) {
          backlogged_ = false;
          cleared = true;
        }
      }
      if (acks_) buffer_->Ack(read_to);
      if (cleared) buffer_->Resume(shared_from_this());
      if (rng_() % 4 == 0) std::this_thread::yield();
    }
  }

  LogBuffer* const buffer_;
  const bool acks_;
  std::minstd_rand rng_;  // the drainer's
  std::thread drainer_;
  absl::Mutex mu_;
  std::deque<LogRecordPtr> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> got_ ABSL_GUARDED_BY(mu_);
  bool backlogged_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int refusals_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_CASE("Subscribers paused and resumed by their own threads while two "
          "threads append and both ack get every record once, in order",
          "[logs][concurrency]") {
  constexpr int kPerThread = 20000;
  constexpr size_t kTotal = 2 * kPerThread;
  // Capacity for all of them: only the ack cap keeps what a paused one
  // still needs.
  auto owned = MakeLogBuffer(kTotal + 1);
  LogBuffer& buffer = *owned;
  auto first = std::make_shared<DrainedSubscriber>(&buffer, true, 1);
  auto second = std::make_shared<DrainedSubscriber>(&buffer, true, 2);
  REQUIRE(buffer.Subscribe(first, 0).ok());
  REQUIRE(buffer.Subscribe(second, 0).ok());
  first->Start();
  second->Start();
  auto append = [&] {
    for (int i = 0; i < kPerThread; i += 4) {
      buffer.Append({Entry("a"), Entry("b"), Entry("c"), Entry("d")});
    }
  };
  std::thread one(append);
  std::thread two(append);
  one.join();
  two.join();
  for (auto* sub : {first.get(), second.get()}) {
    const std::vector<uint64_t> seqs =
        sub->AwaitSeqs(kTotal, absl::Seconds(60));
    REQUIRE(seqs.size() == kTotal);
    bool consecutive = true;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i] != i + 1) consecutive = false;
    }
    REQUIRE(consecutive);
    REQUIRE(sub->refusals() > 0);  // it was paused at least once
    REQUIRE_FALSE(buffer.paused(sub));
  }
  REQUIRE(buffer.dropped_total() == 0);
  first->Stop();
  second->Stop();
  REQUIRE(buffer.buffered() == 0);
}

// Refuses the next deliveries, and its backlog clears at once each time:
// another thread calls Resume while Deliver has yet to return false (before
// the buffer can have recorded the pause), as the reaction thread's
// OnBacklogCleared may.
class ClearsAtOnceSubscriber
    : public LogSubscriber,
      public std::enable_shared_from_this<ClearsAtOnceSubscriber> {
 public:
  explicit ClearsAtOnceSubscriber(LogBuffer* buffer) : buffer_(buffer) {}
  ~ClearsAtOnceSubscriber() override { JoinAll(); }
  void RefuseNext(int n) {
    absl::MutexLock lock(&mu_);
    refuse_ = n;
  }
  bool Deliver(std::vector<LogRecordPtr> records) override {
    {
      absl::MutexLock lock(&mu_);
      if (refuse_ == 0) {
        for (auto& r : records) got_.push_back(r);
        return true;
      }
      --refuse_;
      resumers_.emplace_back(
          [self = shared_from_this()] { self->buffer_->Resume(self); });
    }
    // Give the resumer time to get as far as it can before the refusal.
    absl::SleepFor(absl::Milliseconds(50));
    return false;
  }
  // Joins every resumer started so far and those they start.
  void JoinAll() {
    for (;;) {
      std::vector<std::thread> resumers;
      {
        absl::MutexLock lock(&mu_);
        resumers.swap(resumers_);
      }
      if (resumers.empty()) return;
      for (auto& t : resumers) t.join();
    }
  }
  std::vector<std::string> got() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const auto& r : got_) out.push_back(FullOf(*r).message());
    return out;
  }

 private:
  LogBuffer* const buffer_;
  absl::Mutex mu_;
  int refuse_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> resumers_ ABSL_GUARDED_BY(mu_);
  std::vector<LogRecordPtr> got_ ABSL_GUARDED_BY(mu_);
};

TEST_CASE("A backlog that clears before the buffer records the pause still "
          "resumes the subscriber (no lost wake-up)",
          "[logs]") {
  auto owned = MakeLogBuffer(100);
  LogBuffer& buffer = *owned;
  auto sub = std::make_shared<ClearsAtOnceSubscriber>(&buffer);
  REQUIRE(buffer.Subscribe(sub, 0).ok());
  // Refused by Append's delivery.
  sub->RefuseNext(1);
  buffer.Append({Entry("1")});
  sub->JoinAll();
  REQUIRE_FALSE(buffer.paused(sub.get()));
  buffer.Append({Entry("2")});
  // Refused by Append's delivery, then by that Resume's own.
  sub->RefuseNext(2);
  buffer.Append({Entry("3")});
  sub->JoinAll();
  REQUIRE_FALSE(buffer.paused(sub.get()));
  buffer.Append({Entry("4")});
  REQUIRE(sub->got() == std::vector<std::string>{"1", "2", "3", "4"});
}

TEST_CASE("Records of no call a paused host refused, and nobody else got, "
          "are kept for the next client once it goes",
          "[logs]") {
  auto owned = MakeLogBuffer(100);
  LogBuffer& buffer = *owned;
  auto gone = std::make_shared<RecordingSubscriber>("client-a");
  auto other = std::make_shared<RecordingSubscriber>("client-c");
  REQUIRE(buffer.Subscribe(gone, 0).ok());
  REQUIRE(buffer.Subscribe(other, 0).ok());
  gone->Refuse(true);
  // One batch: a record of client-c's call (which client-c takes) and two
  // of no call (which client-c takes as well), then one of client-a's call
  // and one of no call when client-c is gone too.
  buffer.Append({Entry("c1"), Entry("n1")}, {"client-c"});
  REQUIRE(buffer.paused(gone.get()));
  buffer.Unsubscribe(other.get());
  buffer.Append({Entry("a1"), Entry("n2")}, {"client-a"});
  // client-a's host goes away without having taken any of them.
  buffer.Unsubscribe(gone.get());
  auto next = std::make_shared<RecordingSubscriber>("client-b");
  REQUIRE(buffer.Subscribe(next, 0).ok());
  // n1 reached client-c; n2 reached nobody: the next client gets it, once.
  REQUIRE(Messages(*next) == std::vector<std::string>{"n2"});
  auto after = std::make_shared<RecordingSubscriber>("client-d");
  REQUIRE(buffer.Subscribe(after, 0).ok());
  REQUIRE(after->got().empty());
}

TEST_CASE("A record of no call refused by its only subscriber is kept for "
          "the next client",
          "[logs]") {
  auto owned = MakeLogBuffer(100);
  LogBuffer& buffer = *owned;
  auto gone = std::make_shared<RecordingSubscriber>("client-a");
  REQUIRE(buffer.Subscribe(gone, 0).ok());
  gone->Refuse(true);
  buffer.Append({Entry("r1")});  // refused: paused
  buffer.Append({Entry("r2")});  // while paused
  buffer.Unsubscribe(gone.get());
  auto next = std::make_shared<RecordingSubscriber>("client-b");
  REQUIRE(buffer.Subscribe(next, 0).ok());
  REQUIRE(Messages(*next) == std::vector<std::string>{"r1", "r2"});
}

TEST_CASE("A new host that names no client is not sent the drop report of "
          "a resumed one",
          "[logs]") {
  {
    auto owned = MakeLogBuffer(2);
    LogBuffer& buffer = *owned;
    auto lagging = std::make_shared<RecordingSubscriber>();
    REQUIRE(buffer.Subscribe(lagging, 0).ok());
    lagging->Refuse(true);
    for (int i = 1; i <= 4; ++i) buffer.Append({Entry(std::to_string(i))});
    lagging->Refuse(false);
    buffer.Resume(lagging);
    REQUIRE(DropReports(*lagging).size() == 1);
    // A host connecting afresh: the report was the other stream's, about
    // records it never asked for. (A client's report, like its records,
    // waits for that client's streams.)
    auto fresh = std::make_shared<RecordingSubscriber>();
    REQUIRE(buffer.Subscribe(fresh, 0).ok());
    REQUIRE(DropReports(*fresh).empty());
  }
}

TEST_CASE("A host that resubscribes after a seq is told only the records it "
          "would have got that left the buffer, not other clients'",
          "[logs]") {
  auto owned = MakeLogBuffer(4);
  LogBuffer& buffer = *owned;
  auto a = std::make_shared<RecordingSubscriber>("client-a");
  auto b = std::make_shared<RecordingSubscriber>("client-b");
  REQUIRE(buffer.Subscribe(a, 0).ok());
  REQUIRE(buffer.Subscribe(b, 0).ok());
  buffer.Append({Entry("a1")}, {"client-a"});
  const uint64_t cursor = a->got().back()->seq();
  // a's stream breaks; while it is away 3 of a's records, 2 of no call
  // and 5 of b's pass through the 4-entry buffer.
  buffer.Unsubscribe(a.get());
  buffer.Append({Entry("a2"), Entry("none1"), Entry("b1"), Entry("b2"),
                 Entry("a3"), Entry("b3"), Entry("none2"), Entry("b4"),
                 Entry("b5"), Entry("a4")},
                {"client-a", "", "client-b", "client-b", "client-a",
                 "client-b", "", "client-b", "client-b", "client-a"});
  // Left: none2 (delivered to b), b4, b5, a4. Gone after the cursor: a2,
  // a3 (a's) and none1 (no call's); b1-b3 are b's, not a's loss.
  auto again = std::make_shared<RecordingSubscriber>("client-a");
  REQUIRE(buffer.Subscribe(again, cursor, buffer.instance_id()).ok());
  auto got = Messages(*again);
  REQUIRE(got.size() == 3);
  CHECK(got[0] == "none2");
  CHECK(got[1] == "a4");
  CHECK(got[2].find("3 sandbox log records were dropped") == 0);
  // The report is a's alone: b, reading all along, is not sent it, and a
  // later host of another client does not get it either.
  CHECK(DropReports(*b).empty());
  // Storing a's report evicted none2 (b has it). A host of client c
  // resubscribing after the same seq lost none1 and none2 of what it would
  // have got (no call's), and nothing of a's or b's.
  auto c = std::make_shared<RecordingSubscriber>("client-c");
  REQUIRE(buffer.Subscribe(c, cursor, buffer.instance_id()).ok());
  REQUIRE(DropReports(*c).size() == 1);
  CHECK(DropReports(*c)[0].find("2 sandbox log records were dropped") == 0);
  CHECK(Messages(*c).size() == 1);
}

TEST_CASE("What another client's ack frees counts for a host that "
          "resubscribes before it; its own ack's does not",
          "[logs]") {
  auto owned = MakeLogBuffer(100);
  LogBuffer& buffer = *owned;
  auto a = std::make_shared<RecordingSubscriber>("client-a");
  auto b = std::make_shared<RecordingSubscriber>("client-b");
  REQUIRE(buffer.Subscribe(a, 0).ok());
  REQUIRE(buffer.Subscribe(b, 0).ok());
  buffer.Append({Entry("a1"), Entry("a2"), Entry("none"), Entry("b1")},
                {"client-a", "client-a", "", "client-b"});
  // a's host replayed a1 only when its stream broke; b acknowledges all.
  const uint64_t cursor = a->got().front()->seq();
  buffer.Unsubscribe(a.get());
  buffer.Ack(100, "client-b");
  auto again = std::make_shared<RecordingSubscriber>("client-a");
  REQUIRE(buffer.Subscribe(again, cursor, buffer.instance_id()).ok());
  // a2 (delivered to the broken stream, freed by b's ack) and "none".
  REQUIRE(DropReports(*again).size() == 1);
  CHECK(DropReports(*again)[0].find("2 sandbox log records were dropped") ==
        0);
  // A host's own acks free nothing it would be told of.
  auto d = std::make_shared<RecordingSubscriber>("client-d");
  REQUIRE(buffer.Subscribe(d, 0).ok());
  buffer.Append({Entry("d1")}, {"client-d"});
  const uint64_t d_cursor = d->got().back()->seq();
  buffer.Ack(d_cursor, "client-d");
  buffer.Unsubscribe(d.get());
  auto d_again = std::make_shared<RecordingSubscriber>("client-d");
  REQUIRE(buffer.Subscribe(d_again, d_cursor, buffer.instance_id()).ok());
  CHECK(d_again->got().empty());
}

TEST_CASE("A client's records evicted before any of its streams got them are "
          "reported to that client, not to every host",
          "[logs]") {
  auto owned = MakeLogBuffer(2);
  LogBuffer& buffer = *owned;
  auto b = std::make_shared<RecordingSubscriber>("client-b");
  REQUIRE(buffer.Subscribe(b, 0).ok());
  // Client a's calls log before a's stream subscribes: 4 records through
  // a 2-entry buffer, while b reads.
  buffer.Append({Entry("a1"), Entry("a2"), Entry("a3"), Entry("a4")},
                {"client-a", "client-a", "client-a", "client-a"});
  buffer.Append({Entry("none")});
  CHECK(DropReports(*b).empty());
  auto a = std::make_shared<RecordingSubscriber>("client-a");
  REQUIRE(buffer.Subscribe(a, 0).ok());
  // a4 is still there; a1-a3 are a's loss, told to a.
  REQUIRE(DropReports(*a).size() == 1);
  CHECK(DropReports(*a)[0].find("3 sandbox log records were dropped") == 0);
}

TEST_CASE("A drop report a host never replayed is not counted twice when it "
          "resubscribes",
          "[logs]") {
  for (const bool replayed_catch_up : {false, true}) {
    auto owned = MakeLogBuffer(4);
    LogBuffer& buffer = *owned;
    auto a = std::make_shared<RecordingSubscriber>("client-a");
    REQUIRE(buffer.Subscribe(a, 0).ok());
    buffer.Append({Entry("a1")}, {"client-a"});  // seq 1
    a->Refuse(true);
    for (const char* m : {"a2", "a3", "a4", "a5", "a6", "a7"}) {
      buffer.Append({Entry(m)}, {"client-a"});
    }
    // Paused after a1: a2 and a3 were evicted meanwhile; the resume sends
    // a4-a7 and a report of those 2 (storing it evicts a4, sent already).
    a->Refuse(false);
    buffer.Resume(a);
    REQUIRE(Messages(*a).size() == 6);
    REQUIRE(DropReports(*a).size() == 1);
    CHECK(DropReports(*a)[0].find("2 sandbox log records were dropped") == 0);
    // The stream ends before the host replayed the report: it had replayed
    // a1 only, or a1, a4 and a5.
    const uint64_t cursor =
        replayed_catch_up ? a->got()[2]->seq() : a->got()[0]->seq();
    const uint64_t replayed = replayed_catch_up ? 3 : 1;
    buffer.Unsubscribe(a.get());
    auto again = std::make_shared<RecordingSubscriber>("client-a");
    REQUIRE(buffer.Subscribe(again, cursor, buffer.instance_id()).ok());
    uint64_t reported = 0;
    for (const std::string& m : DropReports(*again)) {
      reported += std::stoull(m.substr(0, m.find(' ')));
    }
    const uint64_t received = Messages(*again).size() - DropReports(*again).size();
    // a1-a7: every one replayed, received again or counted, once.
    CHECK(replayed + received + reported == 7);
  }
}

}  // namespace
}  // namespace agentix::sandbox
