#include "sandbox/log_buffer.h"

#include <catch2/catch.hpp>

#include "absl/synchronization/mutex.h"

namespace agentix::sandbox {
namespace {

class RecordingSubscriber : public LogSubscriber {
 public:
  void Deliver(std::vector<LogRecordPtr> records) override {
    absl::MutexLock lock(&mu_);
    for (auto& r : records) got_.push_back(r);
  }
  std::vector<LogRecordPtr> got() {
    absl::MutexLock lock(&mu_);
    return got_;
  }

 private:
  absl::Mutex mu_;
  std::vector<LogRecordPtr> got_ ABSL_GUARDED_BY(mu_);
};

ipc::LogEntry Entry(const std::string& message) {
  ipc::LogEntry e;
  e.logger = "app";
  e.message = message;
  e.call_id = "c1";
  return e;
}

TEST_CASE("Records before any subscriber are buffered and replayed in order",
          "[logs]") {
  LogBuffer buffer(100);
  buffer.Append(Entry("one"), "w1");
  buffer.Append(Entry("two"), "w1");
  auto sub = std::make_shared<RecordingSubscriber>();
  buffer.Subscribe(sub, 0);
  buffer.Append(Entry("three"), "w2");
  auto got = sub->got();
  REQUIRE(got.size() == 3);
  REQUIRE(got[0]->message() == "one");
  REQUIRE(got[0]->seq() == 1);
  REQUIRE(got[0]->worker_id() == "w1");
  REQUIRE(got[0]->call_id() == "c1");
  REQUIRE(got[2]->message() == "three");
  REQUIRE(got[2]->seq() == 3);
  REQUIRE(got[2]->worker_id() == "w2");
}

TEST_CASE("Resubscribing after a seq skips what was seen; acks free space",
          "[logs]") {
  LogBuffer buffer(100);
  for (const char* m : {"a", "b", "c"}) buffer.Append(Entry(m), "w");
  auto sub = std::make_shared<RecordingSubscriber>();
  buffer.Subscribe(sub, 2);
  REQUIRE(sub->got().size() == 1);
  REQUIRE(sub->got()[0]->message() == "c");
  buffer.Ack(2);
  REQUIRE(buffer.buffered() == 1);
  buffer.Unsubscribe(sub.get());
  buffer.Append(Entry("d"), "w");
  REQUIRE(sub->got().size() == 1);  // unsubscribed: nothing more

  // A cursor from another daemon instance does not skip anything here.
  auto other = std::make_shared<RecordingSubscriber>();
  buffer.Subscribe(other, 3, "not-this-daemon");
  REQUIRE(other->got().size() == 2);  // "c" and "d" (a and b were acked)
  auto same = std::make_shared<RecordingSubscriber>();
  buffer.Subscribe(same, 3, buffer.instance_id());
  REQUIRE(same->got().size() == 1);  // "d"
  REQUIRE(buffer.instance_id().size() == 16);
}

TEST_CASE("Overflow drops the oldest and says so in one warning record",
          "[logs]") {
  LogBuffer buffer(3);
  for (int i = 0; i < 10; ++i) buffer.Append(Entry(std::to_string(i)), "w");
  REQUIRE(buffer.dropped_total() == 7);
  auto sub = std::make_shared<RecordingSubscriber>();
  buffer.Subscribe(sub, 0);
  auto got = sub->got();
  REQUIRE(got.size() == 3);  // "8", "9" and the warning; "7" made room
  REQUIRE(got[0]->message() == "8");
  REQUIRE(got[1]->message() == "9");
  REQUIRE(got[2]->level_name() == "WARNING");
  REQUIRE(got[2]->origin() == runtime::v1::LOG_ORIGIN_RUNTIME);
  REQUIRE(got[2]->message().find("8 sandbox log records were dropped") == 0);
  // Seqs stay increasing across the warning.
  REQUIRE(got[2]->seq() > got[1]->seq());
}

TEST_CASE("Every subscriber gets every record", "[logs]") {
  LogBuffer buffer(10);
  auto a = std::make_shared<RecordingSubscriber>();
  auto b = std::make_shared<RecordingSubscriber>();
  buffer.Subscribe(a, 0);
  buffer.Subscribe(b, 0);
  buffer.Append({Entry("x"), Entry("y")}, "w");
  REQUIRE(a->got().size() == 2);
  REQUIRE(b->got().size() == 2);
}

}  // namespace
}  // namespace agentix::sandbox
