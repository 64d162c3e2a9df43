#include "sandbox/session_manager.h"

#include <atomic>
#include <cstring>
#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "sandbox/fake_worker_calls.h"
#include "sandbox/recording_sink.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::HostEvent;
using runtime::v1::SandboxEvent;
using HostEvents = google::protobuf::RepeatedPtrField<HostEvent>;

// The shared RecordingSink, and what the session tests read of the events:
// terminal events counted, stream items, result chunks.
class ItemsSink : public RecordingSink {
 public:
  int CountTerminal(const std::string& call_id) {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(TerminalsLocked(call_id).size());
  }

  std::vector<const SandboxEvent*> TerminalsLocked(const std::string& call_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<const SandboxEvent*> out;
    for (const auto& e : events_) {
      if ((e->has_result() && e->result().call_id() == call_id) ||
          (e->has_error() && e->error().call_id() == call_id)) {
        out.push_back(e.get());
      }
    }
    return out;
  }

  // Waits up to 10 s until `call_id` has `n` terminal events; returns the
  // last of them (empty if fewer arrived).
  SandboxEvent AwaitNthTerminal(const std::string& call_id, int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return TerminalsLocked(call_id).size() >= static_cast<size_t>(n);
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    auto terminals = TerminalsLocked(call_id);
    return terminals.size() >= static_cast<size_t>(n) ? *terminals[n - 1]
                                                       : SandboxEvent();
  }

  // Values of the StreamItems of `call_id`, in arrival order.
  std::vector<std::string> Items(const std::string& call_id) {
    absl::MutexLock lock(&mu_);
    return ItemsLocked(call_id);
  }

  // Waits up to 10 s until `n` items of `call_id` arrived; returns them.
  std::vector<std::string> AwaitItems(const std::string& call_id, size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return ItemsLocked(call_id).size() >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return ItemsLocked(call_id);
  }

  // Concatenated ResultChunk bytes for `call_id`.
  std::string Chunks(const std::string& call_id) {
    absl::MutexLock lock(&mu_);
    std::string out;
    for (const auto& e : events_) {
      if (e->has_result_chunk() && e->result_chunk().call_id() == call_id) {
        out += e->result_chunk().data();
      }
    }
    return out;
  }

 private:
  std::vector<std::string> ItemsLocked(const std::string& call_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::string> out;
    for (const auto& e : events_) {
      if (e->has_stream_item() && e->stream_item().call_id() == call_id) {
        out.push_back(e->stream_item().value());
      }
    }
    return out;
  }
};

// An ItemsSink of a named client (agentix-client-id).
class ClientSink final : public ItemsSink {
 public:
  explicit ClientSink(std::string id) : id_(std::move(id)) {}
  const std::string& client_id() const override { return id_; }

 private:
  std::string id_;
};

HostEvent Start(const std::string& id, const std::string& callable,
                const std::string& args = "", uint64_t total = 0) {
  HostEvent e;
  auto* s = e.mutable_start();
  s->set_call_id(id);
  s->set_callable(callable);
  // The fake worker's arguments are raw text, not a pickle.
  s->set_encoding(runtime::v1::ENCODING_PICKLE);
  s->set_arguments(args);
  s->set_arguments_size(total);
  return e;
}

HostEvent Chunk(const std::string& id, const std::string& data) {
  HostEvent e;
  e.mutable_argument_chunk()->set_call_id(id);
  e.mutable_argument_chunk()->set_data(data);
  return e;
}

HostEvent CancelEvent(const std::string& id) {
  HostEvent e;
  e.mutable_cancel()->set_call_id(id);
  return e;
}

HostEvent ResumeEvent(std::vector<std::string> ids) {
  HostEvent e;
  for (auto& id : ids) e.mutable_resume()->add_call_ids(id);
  return e;
}

HostEvent AckEvent(const std::string& id) {
  HostEvent e;
  e.mutable_ack()->set_call_id(id);
  return e;
}

TEST_CASE("A call returns its result to the stream that made it",
          "[sandbox]") {
  SessionManager manager(FakeWorkerOptions());
  auto sink = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(sink, Start("c1", "fake::echo", "hello"));
  SandboxEvent e = sink->AwaitTerminal("c1");
  REQUIRE(e.has_result());
  REQUIRE(e.result().value() == "hello");
  REQUIRE(e.result().value_size() == 5);
  REQUIRE(manager.Info().workers_started == 1);
}

TEST_CASE("Large arguments and results travel in chunks", "[sandbox]") {
  SessionOptions options = FakeWorkerOptions();
  SECTION("through the payload ring") {}
  SECTION("through a ring too small for a chunk") {
    options.worker.payload_ring_bytes = 512 * 1024;
  }
  SECTION("through the socketpair only") {
    options.worker.payload_ring_bytes = 0;
  }
  SessionManager manager(options);
  auto sink = std::make_shared<ItemsSink>();
  std::string payload(5 * ipc::kChunkBytes + 123, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = char(i * 7);
  const size_t first = ipc::kChunkBytes;
  manager.HandleHostEvent(
      sink, Start("big", "fake::echo", payload.substr(0, first),
                  payload.size()));
  for (size_t off = first; off < payload.size(); off += ipc::kChunkBytes) {
    manager.HandleHostEvent(
        sink, Chunk("big", payload.substr(off, ipc::kChunkBytes)));
  }
  SandboxEvent e = sink->AwaitTerminal("big");
  REQUIRE(e.has_result());
  REQUIRE(e.result().value_size() == payload.size());
  REQUIRE(sink->Chunks("big") + e.result().value() == payload);
}

TEST_CASE("Argument chunks of every size in one message arrive in order",
          "[sandbox]") {
  // Chunks far below and at kChunkBytes, and a re-sent overlap (trimmed):
  // the worker must see the bytes once each, in order, whichever way each
  // piece travels (a small ring takes some and refuses others).
  SessionOptions options = FakeWorkerOptions();
  SECTION("default ring") {}
  SECTION("small ring") { options.worker.payload_ring_bytes = 128 * 1024; }
  SECTION("no ring") { options.worker.payload_ring_bytes = 0; }
  SessionManager manager(options);
  auto sink = std::make_shared<ItemsSink>();
  const std::vector<size_t> sizes = {100, 70 * 1024, 10, ipc::kChunkBytes,
                                     5, 64 * 1024, 64 * 1024 - 1};
  size_t total = 0;
  for (size_t size : sizes) total += size;
  std::string payload(total, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = char(i * 13 + 1);
  google::protobuf::RepeatedPtrField<HostEvent> events;
  *events.Add() = Start("mixed", "fake::echo", payload.substr(0, sizes[0]),
                        payload.size());
  size_t off = sizes[0];
  for (size_t i = 1; i < sizes.size(); ++i) {
    HostEvent chunk = Chunk("mixed", payload.substr(off, sizes[i]));
    chunk.mutable_argument_chunk()->set_offset(off);
    *events.Add() = chunk;
    if (i == 3) {
      // The same large chunk again from 1,000 bytes into it (a resumed
      // upload): only its unseen part counts, here none of it.
      HostEvent again =
          Chunk("mixed", payload.substr(off + 1000, sizes[i] - 1000));
      again.mutable_argument_chunk()->set_offset(off + 1000);
      *events.Add() = again;
    }
    off += sizes[i];
  }
  manager.HandleHostEvents(sink, events);
  SandboxEvent e = sink->AwaitTerminal("mixed");
  REQUIRE(e.has_result());
  REQUIRE(sink->Chunks("mixed") + e.result().value() == payload);
}

TEST_CASE("Exactly one terminal event per call", "[sandbox]") {
  SessionManager manager(FakeWorkerOptions());
  auto sink = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(sink, Start("d", "fake::double"));
  REQUIRE(sink->AwaitTerminal("d").result().value() == "first");
  // A duplicate start of a known id runs nothing.
  manager.HandleHostEvent(sink, Start("d", "fake::double"));
  manager.HandleHostEvent(sink, Start("after", "fake::echo", "x"));
  sink->AwaitTerminal("after");
  REQUIRE(sink->CountTerminal("d") == 1);
}

TEST_CASE("Cancel ends the call with Cancelled; late frames are dropped",
          "[sandbox]") {
  SessionManager manager(FakeWorkerOptions());
  auto owner = std::make_shared<ItemsSink>();
  auto other = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(owner, Start("h", "fake::hang"));
  manager.HandleHostEvent(owner, Start("l", "fake::late"));
  // A cancel from another client still tells the caller.
  manager.HandleHostEvent(other, CancelEvent("h"));
  manager.HandleHostEvent(owner, CancelEvent("l"));
  SandboxEvent e = owner->AwaitTerminal("h");
  REQUIRE(e.has_error());
  REQUIRE(e.error().error().type() == "Cancelled");
  REQUIRE(e.error().error().cancelled());
  REQUIRE(e.error().error().code() == int(absl::StatusCode::kCancelled));
  REQUIRE(owner->AwaitTerminal("l").error().error().type() == "Cancelled");
  absl::SleepFor(absl::Milliseconds(400));  // fake::late answers at 200 ms
  REQUIRE(owner->CountTerminal("l") == 1);
  REQUIRE(other->CountTerminal("h") == 0);
  // Cancelling an unknown or finished call is a no-op.
  manager.HandleHostEvent(owner, CancelEvent("nope"));
  manager.HandleHostEvent(owner, CancelEvent("h"));
  REQUIRE(owner->CountTerminal("h") == 1);
}

TEST_CASE("A crash report longer than the usual stderr tail is quoted whole",
          "[sandbox]") {
  SessionManager manager(FakeWorkerOptions());
  auto sink = std::make_shared<ItemsSink>();
  // ~9 KiB of report (every thread's stack): far over the 2 KiB tail.
  manager.HandleHostEvent(sink, Start("c", "fake::crash", "200"));
  SandboxEvent c = sink->AwaitTerminal("c");
  REQUIRE(c.error().error().type() == "WorkerDied");
  const std::string& message = c.error().error().message();
  INFO(message);
  CHECK(message.find("last stderr output:\nFatal Python error: "
                     "Segmentation fault") != std::string::npos);
  CHECK(message.find("line 0 in frame") != std::string::npos);
  CHECK(message.find("line 199 in frame") != std::string::npos);
  CHECK(message.find("Extension modules: fake") != std::string::npos);
  CHECK(message.find("noise before the crash") == std::string::npos);
}

TEST_CASE("Worker death fails in-flight calls and the next call respawns",
          "[sandbox]") {
  SessionManager manager(FakeWorkerOptions());
  auto sink = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(sink, Start("p1", "fake::pid"));
  const std::string pid1 = sink->AwaitTerminal("p1").result().value();

  SECTION("SIGKILL") {
    manager.HandleHostEvent(sink, Start("slow", "fake::hang"));
    manager.HandleHostEvent(sink, Start("k", "fake::kill"));
    SandboxEvent k = sink->AwaitTerminal("k");
    REQUIRE(k.error().error().type() == "WorkerDied");
    REQUIRE(k.error().error().returncode() == -9);
    REQUIRE(k.error().error().message().find("signal 9") != std::string::npos);
    SandboxEvent slow = sink->AwaitTerminal("slow");
    REQUIRE(slow.error().error().type() == "WorkerDied");
  }
  SECTION("exit code") {
    manager.HandleHostEvent(sink, Start("x", "fake::exit", "7"));
    SandboxEvent x = sink->AwaitTerminal("x");
    REQUIRE(x.error().error().type() == "WorkerDied");
    REQUIRE(x.error().error().returncode() == 7);
    REQUIRE(x.error().error().message() ==
            "runtime worker exited: exit code 7");
  }
  SECTION("garbage frame") {
    manager.HandleHostEvent(sink, Start("g", "fake::garbage"));
    SandboxEvent g = sink->AwaitTerminal("g");
    REQUIRE(g.error().error().type() == "WorkerDied");
    REQUIRE(g.error().error().message().find("frame protocol") !=
            std::string::npos);
  }
  SECTION("ring reference outside the payload ring") {
    manager.HandleHostEvent(sink, Start("r", "fake::bad_ring"));
    SandboxEvent r = sink->AwaitTerminal("r");
    REQUIRE(r.error().error().type() == "WorkerDied");
    REQUIRE(r.error().error().message().find("frame protocol") !=
            std::string::npos);
    REQUIRE(r.error().error().message().find("ring") != std::string::npos);
  }
  manager.HandleHostEvent(sink, Start("p2", "fake::pid"));
  SandboxEvent p2 = sink->AwaitTerminal("p2");
  REQUIRE(p2.has_result());
  REQUIRE(p2.result().value() != pid1);
  REQUIRE(manager.Info().workers_started == 2);
}

TEST_CASE("A worker that cannot boot fails the call with the reason",
          "[sandbox]") {
  auto sink = std::make_shared<ItemsSink>();
  SECTION("boot_error frame") {
    SessionManager manager(FakeWorkerOptions({"FAKE_WORKER_BOOT=fail"}));
    manager.HandleHostEvent(sink, Start("b", "fake::echo"));
    auto e = sink->AwaitTerminal("b").error().error();
    REQUIRE(e.type() == "WorkerBootError");
    REQUIRE(e.message() ==
            "runtime worker failed to boot: ImportError: no module named "
            "'broken_venv'");
  }
  SECTION("exit before ready") {
    SessionManager manager(FakeWorkerOptions({"FAKE_WORKER_BOOT=exit"}));
    manager.HandleHostEvent(sink, Start("b", "fake::echo"));
    auto e = sink->AwaitTerminal("b").error().error();
    REQUIRE(e.type() == "WorkerBootError");
    REQUIRE(e.message() ==
            "runtime worker exited before ready (exit code 4)");
  }
  SECTION("never ready") {
    SessionOptions options = FakeWorkerOptions({"FAKE_WORKER_BOOT=hang"});
    options.worker.ready_timeout = absl::Milliseconds(300);
    SessionManager manager(options);
    manager.HandleHostEvent(sink, Start("b", "fake::echo"));
    auto e = sink->AwaitTerminal("b").error().error();
    REQUIRE(e.type() == "WorkerBootError");
    REQUIRE(e.message().find("did not become ready") != std::string::npos);
  }
  SECTION("missing binary") {
    SessionOptions options = FakeWorkerOptions();
    options.worker.worker_path = "/nonexistent/agentix-worker";
    SessionManager manager(options);
    manager.HandleHostEvent(sink, Start("b", "fake::echo"));
    auto e = sink->AwaitTerminal("b").error().error();
    REQUIRE(e.type() == "WorkerBootError");
    REQUIRE(e.message().find("/nonexistent/agentix-worker") !=
            std::string::npos);
  }
}

TEST_CASE("Malformed host events get BadRequest and change nothing",
          "[sandbox]") {
  SessionManager manager(FakeWorkerOptions());
  auto sink = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(sink, Start("", "fake::echo", "x"));
  REQUIRE(sink->AwaitTerminal("").error().error().type() == "BadRequest");

  manager.HandleHostEvent(sink, Chunk("ghost", "x"));
  auto ghost = sink->AwaitTerminal("ghost").error().error();
  REQUIRE(ghost.type() == "BadRequest");
  REQUIRE(ghost.message().find("unknown call_id") != std::string::npos);

  manager.HandleHostEvent(sink, Start("over", "fake::echo", "ab", 3));
  manager.HandleHostEvent(sink, Chunk("over", "cd"));
  REQUIRE(sink->AwaitTerminal("over").error().error().type() == "BadRequest");

  manager.HandleHostEvent(sink, Start("short", "fake::echo", "abcd", 2));
  REQUIRE(sink->AwaitTerminal("short").error().error().type() ==
          "BadRequest");

  SessionOptions small = FakeWorkerOptions();
  small.max_payload_bytes = 10;
  SessionManager limited(small);
  limited.HandleHostEvent(sink, Start("huge", "fake::echo", "x", 11));
  REQUIRE(sink->AwaitTerminal("huge").error().error().type() ==
          "PayloadTooLarge");

  manager.HandleHostEvent(sink, Start("ok", "fake::echo", "still serving"));
  REQUIRE(sink->AwaitTerminal("ok").result().value() == "still serving");
}

TEST_CASE("Resume re-attaches running calls and replays retained results",
          "[sandbox]") {
  SessionManager manager(FakeWorkerOptions());
  auto a = std::make_shared<ItemsSink>();
  auto b = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(a, Start("run", "fake::sleep", "200"));
  manager.HandleHostEvent(a, Start("done", "fake::echo", "kept"));
  a->AwaitTerminal("done");
  manager.DetachSink(a.get());
  manager.HandleHostEvent(b, ResumeEvent({"run", "done", "unknown"}));
  REQUIRE(b->AwaitTerminal("done").result().value() == "kept");
  REQUIRE(b->AwaitTerminal("run").result().value() == "done");
  auto unknown = b->AwaitTerminal("unknown").error().error();
  REQUIRE(unknown.type() == "ResultUnavailable");
  REQUIRE(a->CountTerminal("run") == 0);

  // After an ack the result is gone.
  manager.HandleHostEvent(b, AckEvent("done"));
  auto c = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(c, ResumeEvent({"done"}));
  REQUIRE(c->AwaitTerminal("done").error().error().type() ==
          "ResultUnavailable");
}

TEST_CASE("A refused call gets one terminal event, even if chunks follow",
          "[sandbox]") {
  SessionManager manager(FakeWorkerOptions());
  auto sink = std::make_shared<ItemsSink>();
  // arguments (5 bytes) larger than arguments_size (3): refused at once.
  manager.HandleHostEvent(sink, Start("a", "fake::echo", "hello", 3));
  manager.HandleHostEvent(sink, Chunk("a", "world"));
  REQUIRE(sink->AwaitTerminal("a").error().error().type() == "BadRequest");
  absl::SleepFor(absl::Milliseconds(50));
  REQUIRE(sink->CountTerminal("a") == 1);
}

TEST_CASE("An argument chunk that leaves a gap ends the call, once",
          "[sandbox]") {
  // Fuzzer finding: the gap error used to go out while the call went on, so
  // the call had two terminal events.
  SessionManager manager(FakeWorkerOptions());
  auto sink = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(sink, Start("g", "fake::echo", "ab", 6));
  HostEvent gap = Chunk("g", "ef");
  gap.mutable_argument_chunk()->set_offset(4);  // 2 bytes received so far
  manager.HandleHostEvent(sink, gap);
  auto error = sink->AwaitTerminal("g").error().error();
  REQUIRE(error.type() == "BadRequest");
  REQUIRE(error.message().find("leaves a gap") != std::string::npos);
  manager.HandleHostEvent(sink, Chunk("g", "cdef"));  // too late: dropped
  absl::SleepFor(absl::Milliseconds(50));
  REQUIRE(sink->CountTerminal("g") == 1);
  manager.HandleHostEvent(sink, Start("ok", "fake::echo", "still serving"));
  REQUIRE(sink->AwaitTerminal("ok").result().value() == "still serving");
}

TEST_CASE("A re-sent StartCall never runs a call twice", "[sandbox]") {
  SessionOptions options = FakeWorkerOptions();
  options.max_retained_results = 1;
  // The remembered ids sharded (the default) and in one set (as<int>: the
  // values by value; the first an lvalue would make them references).
  options.finished_ids_shard_bits =
      GENERATE(as<int>{}, FinishedIds::kShardBits, 0);
  SessionManager manager(options);
  auto a = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(a, Start("acked", "fake::echo", "x"));
  a->AwaitTerminal("acked");
  manager.HandleHostEvent(a, AckEvent("acked"));
  manager.HandleHostEvent(a, Start("evicted", "fake::echo", "y"));
  a->AwaitTerminal("evicted");
  manager.HandleHostEvent(a, Start("newest", "fake::echo", "z"));  // evicts
  a->AwaitTerminal("newest");
  // "running" must still run when b resumes: its result, once retained,
  // evicts "newest" (one result is kept), and b would get
  // ResultUnavailable for it; 300 ms is short on a loaded machine.
  manager.HandleHostEvent(a, Start("running", "fake::sleep", "3000"));

  // A reconnecting host re-sends every start, then resumes, in one message
  // (as separate messages, "fresh" could finish before the resume and its
  // retained result evict "newest": the ASan flake of this case).
  auto b = std::make_shared<ItemsSink>();
  google::protobuf::RepeatedPtrField<HostEvent> events;
  for (const char* id : {"acked", "evicted", "newest", "running", "fresh"}) {
    *events.Add() = Start(id, "fake::echo", "again");
  }
  *events.Add() =
      ResumeEvent({"acked", "evicted", "newest", "running", "fresh"});
  manager.HandleHostEvents(b, events);
  for (const char* id : {"acked", "evicted"}) {
    REQUIRE(b->AwaitTerminal(id).error().error().type() ==
            "ResultUnavailable");
  }
  REQUIRE(b->AwaitTerminal("newest").result().value() == "z");
  REQUIRE(b->AwaitTerminal("running").result().value() == "done");
  REQUIRE(b->AwaitTerminal("fresh").result().value() == "again");
  REQUIRE(b->CountTerminal("fresh") == 1);
}

HostEvents Message(std::initializer_list<HostEvent> events) {
  HostEvents out;
  for (const HostEvent& event : events) *out.Add() = event;
  return out;
}

TEST_CASE("Acks may follow the starts of one message only when that changes "
          "nothing",
          "[sandbox]") {
  // A sequential caller's message: its previous call's ack, its next start.
  REQUIRE(AcksCanFollowStarts(
      Message({AckEvent("1"), Start("2", "fake::echo", "x")})));
  REQUIRE(AcksCanFollowStarts(Message({AckEvent("1"), AckEvent("2"),
                                       Start("3", "fake::echo", "x"),
                                       Start("4", "fake::echo", "x")})));
  // Nothing to gain: no start, or no ack.
  REQUIRE_FALSE(AcksCanFollowStarts(Message({AckEvent("1")})));
  REQUIRE_FALSE(
      AcksCanFollowStarts(Message({Start("2", "fake::echo", "x")})));
  // A start of an id acked in the same message must find it finished.
  REQUIRE_FALSE(AcksCanFollowStarts(
      Message({AckEvent("1"), Start("1", "fake::echo", "x")})));
  // Other events see the acks in order.
  REQUIRE_FALSE(AcksCanFollowStarts(Message(
      {AckEvent("1"), Start("2", "fake::echo", "x"), ResumeEvent({"1"})})));
  REQUIRE_FALSE(AcksCanFollowStarts(Message(
      {AckEvent("1"), CancelEvent("1"), Start("2", "fake::echo", "x")})));
  // Many acks (a pipelined caller) are looked up in a set.
  HostEvents many;
  for (int i = 0; i < 20; ++i) *many.Add() = AckEvent(absl::StrCat("a", i));
  *many.Add() = Start("b", "fake::echo", "x");
  REQUIRE(AcksCanFollowStarts(many));
  *many.Add() = Start("a7", "fake::echo", "x");
  REQUIRE_FALSE(AcksCanFollowStarts(many));
}

TEST_CASE("A message of an ack and a start: the start runs, the acked result "
          "is gone, a start of the acked id in it is refused",
          "[sandbox]") {
  SessionOptions options = FakeWorkerOptions();
  options.acks_after_starts = GENERATE(true, false);
  SessionManager manager(options);
  auto a = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(a, Start("one", "fake::echo", "1"));
  REQUIRE(a->AwaitTerminal("one").result().value() == "1");
  manager.HandleHostEvents(
      a, Message({AckEvent("one"), Start("two", "fake::echo", "2")}));
  REQUIRE(a->AwaitTerminal("two").result().value() == "2");
  // "one" was acked: not resumable, never run again.
  auto b = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(b, ResumeEvent({"one"}));
  REQUIRE(b->AwaitTerminal("one").error().error().type() ==
          "ResultUnavailable");
  manager.HandleHostEvent(b, Start("one", "fake::echo", "again"));
  REQUIRE(b->AwaitNthTerminal("one", 2).error().error().type() ==
          "ResultUnavailable");

  // The same id acked and started in one message: the ack comes first.
  manager.HandleHostEvents(
      a, Message({AckEvent("two"), Start("two", "fake::echo", "again")}));
  REQUIRE(a->AwaitNthTerminal("two", 2).error().error().type() ==
          "ResultUnavailable");
  REQUIRE(a->CountTerminal("two") == 2);
}

TEST_CASE("A call id in flight or retained for another client is refused "
          "at once; that client cannot touch the call",
          "[sandbox]") {
  SessionManager manager(FakeWorkerOptions());
  auto a = std::make_shared<ClientSink>("client-a");
  auto b = std::make_shared<ClientSink>("client-b");
  manager.HandleHostEvent(a, Start("running", "fake::sleep", "300"));
  manager.HandleHostEvent(a, Start("kept", "fake::echo", "mine"));
  a->AwaitTerminal("kept");
  for (const char* id : {"running", "kept"}) {
    manager.HandleHostEvent(b, Start(id, "fake::echo", "theirs"));
    const auto refused = b->AwaitTerminal(id).error().error();
    CHECK(refused.type() == "CallIdInUse");
    CHECK(refused.code() == static_cast<int>(absl::StatusCode::kAlreadyExists));
    // Nor may the other client ack or resume it (cancel, as in the
    // original, works from anywhere).
    manager.HandleHostEvent(b, AckEvent(id));
  }
  auto b2 = std::make_shared<ClientSink>("client-b");
  manager.HandleHostEvent(b2, ResumeEvent({"kept"}));
  CHECK(b2->AwaitTerminal("kept").error().error().type() == "CallIdInUse");
  // The owner's calls are untouched: the running one completes, the
  // retained one is still there for a resume by the same client.
  CHECK(a->AwaitTerminal("running").result().value() == "done");
  auto a2 = std::make_shared<ClientSink>("client-a");
  manager.DetachSink(a.get());
  manager.HandleHostEvent(a2, ResumeEvent({"kept"}));
  CHECK(a2->AwaitTerminal("kept").result().value() == "mine");
  // The owner re-sending its StartCall (a reconnect) is still ignored.
  manager.HandleHostEvent(a2, Start("kept", "fake::echo", "again"));
  CHECK(a2->CountTerminal("kept") == 1);
}

// Direct calls, stage 4: a worker's direct session collapsed into the
// daemon (session_state), then resumed as a relayed client's.
TEST_CASE("A collapsed direct session is adopted and resumed", "[sandbox]") {
  SessionManager manager(FakeWorkerOptions());
  REQUIRE(manager.StartWorker().ok());
  ipc::SessionState state;
  SandboxEvent result;
  result.mutable_result()->set_call_id("done");
  result.mutable_result()->set_value("from the worker's session");
  state.calls.push_back({"done", false, {result.SerializeAsString()}});
  state.calls.push_back({"run", true, {}});
  state.finished = {"acked"};
  // Through the codec, as the pieces arrive on the link.
  ipc::SessionState decoded;
  for (const std::string& piece : ipc::EncodeSessionState(state, 64)) {
    REQUIRE(ipc::DecodeSessionStatePiece(piece, decoded).ok());
  }
  REQUIRE(manager.AdoptDirectSession("client-a", decoded) == 2);
  CHECK(manager.Info().calls_in_flight == 1);  // "run", the daemon's now
  CHECK(manager.Quiet().calls_running);

  auto a = std::make_shared<ClientSink>("client-a");
  manager.HandleHostEvent(a, ResumeEvent({"done", "acked"}));
  CHECK(a->AwaitTerminal("done").result().value() ==
        "from the worker's session");
  CHECK(a->AwaitTerminal("acked").error().error().type() ==
        "ResultUnavailable");
  // At most once across the owners: a re-sent start of a finished id is
  // refused, of a held one ignored; another client's is refused.
  manager.HandleHostEvent(a, Start("done", "fake::echo", "again"));
  CHECK(a->CountTerminal("done") == 1);
  auto b = std::make_shared<ClientSink>("client-b");
  manager.HandleHostEvent(b, Start("run", "fake::echo", "theirs"));
  CHECK(b->AwaitTerminal("run").error().error().type() == "CallIdInUse");
  auto a2 = std::make_shared<ClientSink>("client-a");
  manager.HandleHostEvent(a2, Start("acked", "fake::echo", "x"));
  CHECK(a2->AwaitTerminal("acked").error().error().type() ==
        "ResultUnavailable");
  // Adopting the same state again changes nothing.
  CHECK(manager.AdoptDirectSession("client-a", decoded) == 0);

  // The running call is on the live worker: its death ends it, and the
  // resume replays that.
  manager.HandleHostEvent(a, ResumeEvent({"run"}));
  manager.HandleHostEvent(a, Start("k", "fake::kill"));
  CHECK(a->AwaitTerminal("k").error().error().type() == "WorkerDied");
  CHECK(a->AwaitTerminal("run").error().error().type() == "WorkerDied");
  CHECK(manager.Info().calls_in_flight == 0);
}

TEST_CASE("A dead worker's ledger makes WorkerDied calls and refuses its "
          "finished ids",
          "[sandbox]") {
  SessionManager manager(FakeWorkerOptions());
  constexpr uint32_t kCalls = 8, kFinished = 8;
  std::vector<char> region(ipc::LedgerBytes(kCalls, kFinished));
  REQUIRE(ipc::FormatLedger(absl::MakeSpan(region), kCalls, kFinished).ok());
  ipc::LedgerClients clients;
  const uint32_t a = *clients.SlotOf("client-a");
  auto writer = ipc::LedgerWriter::Open(absl::MakeSpan(region));
  REQUIRE(writer.ok());
  REQUIRE((*writer)->Started(a, "live").has_value());
  auto kept = (*writer)->Started(a, "kept");
  REQUIRE(kept.has_value());
  (*writer)->Retained(*kept);
  auto gone = (*writer)->Started(a, "gone");
  REQUIRE(gone.has_value());
  (*writer)->Finished(*gone);
  // Garbage the dying worker left: a slot of a client never assigned.
  char* slot = region.data() + ipc::kLedgerHeaderBytes +
               5 * ipc::kLedgerCallSlotBytes;
  const uint32_t running = 1, unknown = 9;
  const uint16_t length = 4;
  std::memcpy(slot, &running, 4);
  std::memcpy(slot + 4, &unknown, 4);
  std::memcpy(slot + 8, &length, 2);
  std::memcpy(slot + 16, "evil", 4);

  auto read = ipc::ReadLedger(absl::MakeConstSpan(region), kCalls, kFinished,
                              clients);
  REQUIRE(read.ok());
  CHECK(read->skipped == 1);
  WorkerExit exit{"WorkerDied",
                  "runtime worker exited: killed by signal 9 (SIGKILL)", -9};
  REQUIRE(manager.AdoptLedger(*read, exit) == 2);

  auto host = std::make_shared<ClientSink>("client-a");
  manager.HandleHostEvent(host, ResumeEvent({"live", "kept", "evil"}));
  for (const char* id : {"live", "kept"}) {
    const auto error = host->AwaitTerminal(id).error().error();
    CHECK(error.type() == "WorkerDied");
    CHECK(error.returncode() == -9);
  }
  CHECK(host->AwaitTerminal("evil").error().error().type() ==
        "ResultUnavailable");
  // Re-sent starts: never run twice.
  manager.HandleHostEvent(host, Start("gone", "fake::echo", "again"));
  CHECK(host->AwaitTerminal("gone").error().error().type() ==
        "ResultUnavailable");
  manager.HandleHostEvent(host, Start("live", "fake::echo", "again"));
  CHECK(host->CountTerminal("live") == 1);
  CHECK(manager.Info().workers_started == 0);  // nothing ran
}

TEST_CASE("Retained results are bounded; the oldest is evicted",
          "[sandbox]") {
  SessionOptions options = FakeWorkerOptions();
  options.max_retained_results = 2;
  SessionManager manager(options);
  auto sink = std::make_shared<ItemsSink>();
  for (const char* id : {"r1", "r2", "r3"}) {
    manager.HandleHostEvent(sink, Start(id, "fake::echo", id));
    sink->AwaitTerminal(id);
  }
  auto later = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(later, ResumeEvent({"r1", "r3"}));
  REQUIRE(later->AwaitTerminal("r1").error().error().type() ==
          "ResultUnavailable");
  REQUIRE(later->AwaitTerminal("r3").result().value() == "r3");
}

TEST_CASE("Concurrent calls are limited; excess waits, then is refused",
          "[sandbox]") {
  SessionOptions options = FakeWorkerOptions();
  options.max_concurrent_calls = 1;
  options.max_queued_calls = 2;
  SessionManager manager(options);
  auto sink = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(sink, Start("slow", "fake::sleep", "300"));
  manager.HandleHostEvent(sink, Start("waits", "fake::echo", "w"));
  manager.HandleHostEvent(sink, Start("dropped", "fake::echo", "d"));
  manager.HandleHostEvent(sink, Start("refused", "fake::echo", "r"));
  auto refused = sink->AwaitTerminal("refused").error().error();
  REQUIRE(refused.type() == "TooManyCalls");
  REQUIRE(refused.message().find("--max-concurrent-calls 1") !=
          std::string::npos);
  manager.HandleHostEvent(sink, CancelEvent("dropped"));  // while queued
  REQUIRE(sink->AwaitTerminal("dropped").error().error().type() ==
          "Cancelled");
  REQUIRE(sink->CountTerminal("waits") == 0);  // still waiting for the slot
  REQUIRE(sink->AwaitTerminal("slow").result().value() == "done");
  REQUIRE(sink->AwaitTerminal("waits").result().value() == "w");
  REQUIRE(sink->CountTerminal("dropped") == 1);
}

TEST_CASE("Retained results are bounded by bytes too", "[sandbox]") {
  SessionOptions options = FakeWorkerOptions();
  options.max_retained_bytes = 250;  // about two 100-byte results
  SessionManager manager(options);
  auto sink = std::make_shared<ItemsSink>();
  const std::string value(100, 'v');
  for (const char* id : {"b1", "b2", "b3"}) {
    manager.HandleHostEvent(sink, Start(id, "fake::echo", value));
    sink->AwaitTerminal(id);
  }
  auto later = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(later, ResumeEvent({"b1", "b3"}));
  REQUIRE(later->AwaitTerminal("b1").error().error().type() ==
          "ResultUnavailable");
  REQUIRE(later->AwaitTerminal("b3").result().value() == value);
}

TEST_CASE("Streaming calls honour the window; acks free retained items",
          "[sandbox]") {
  SessionManager manager(FakeWorkerOptions());
  auto sink = std::make_shared<ItemsSink>();
  HostEvent start = Start("s", "fake::stream", "5");
  start.mutable_start()->set_stream_window(2);
  manager.HandleHostEvent(sink, start);
  // Only the window's worth arrives before an ack.
  REQUIRE(sink->AwaitItems("s", 2) == std::vector<std::string>{"0", "1"});
  absl::SleepFor(absl::Milliseconds(200));
  REQUIRE(sink->Items("s").size() == 2);
  REQUIRE(sink->CountTerminal("s") == 0);

  HostEvent ack;
  ack.mutable_stream_ack()->set_call_id("s");
  ack.mutable_stream_ack()->set_next_index(2);
  manager.HandleHostEvent(sink, ack);
  REQUIRE(sink->AwaitItems("s", 4).size() == 4);
  ack.mutable_stream_ack()->set_next_index(4);
  manager.HandleHostEvent(sink, ack);
  REQUIRE(sink->AwaitTerminal("s").result().value() == "end");
  REQUIRE(sink->Items("s") ==
          std::vector<std::string>{"0", "1", "2", "3", "4"});

  // A resumed stream replays only what was not acknowledged.
  auto later = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(later, ResumeEvent({"s"}));
  REQUIRE(later->AwaitTerminal("s").result().value() == "end");
  REQUIRE(later->Items("s") == std::vector<std::string>{"4"});
}

TEST_CASE("A huge stream window is capped, so unacknowledged items stay "
          "bounded", "[sandbox]") {
  SessionOptions options = FakeWorkerOptions();
  options.max_stream_window = 3;
  SessionManager manager(options);
  auto sink = std::make_shared<ItemsSink>();
  HostEvent start = Start("s", "fake::stream", "1000");
  start.mutable_start()->set_stream_window(4000000000u);
  manager.HandleHostEvent(sink, start);
  REQUIRE(sink->AwaitItems("s", 3).size() == 3);
  absl::SleepFor(absl::Milliseconds(200));
  REQUIRE(sink->Items("s").size() == 3);
}

// Holds its first delivery for a while before recording it, as a gRPC
// thread preempted between the manager's lock and the hand-over would.
class SlowFirstDeliverySink : public ItemsSink {
 public:
  bool Deliver(std::vector<SandboxEventPtr> events) override {
    if (!delayed_.exchange(true)) absl::SleepFor(absl::Milliseconds(300));
    return RecordingSink::Deliver(std::move(events));
  }

 private:
  std::atomic<bool> delayed_{false};
};

TEST_CASE("A resumed stream gets its replayed items before later ones",
          "[sandbox]") {
  SessionManager manager(FakeWorkerOptions());
  auto a = std::make_shared<ItemsSink>();
  HostEvent start = Start("s", "fake::stream", "6");
  start.mutable_start()->set_stream_window(2);
  manager.HandleHostEvent(a, start);
  REQUIRE(a->AwaitItems("s", 2).size() == 2);
  manager.DetachSink(a.get());

  // A reconnecting host resumes the call and re-sends its StreamAck in the
  // same message: the replay of items 0 and 1 is handed to the new stream
  // (slowly) while the worker, given credit, already produces 2 and 3. The
  // new stream must still see them in order: a host that has item 2 skips
  // a later item 1 as a duplicate, which would lose it.
  auto b = std::make_shared<SlowFirstDeliverySink>();
  google::protobuf::RepeatedPtrField<HostEvent> events;
  *events.Add() = ResumeEvent({"s"});
  HostEvent ack;
  ack.mutable_stream_ack()->set_call_id("s");
  ack.mutable_stream_ack()->set_next_index(2);
  *events.Add() = ack;
  manager.HandleHostEvents(b, events);
  REQUIRE(b->AwaitItems("s", 4) ==
          std::vector<std::string>{"0", "1", "2", "3"});
  ack.mutable_stream_ack()->set_next_index(6);
  manager.HandleHostEvent(b, ack);
  REQUIRE(b->AwaitTerminal("s").result().value() == "end");
  REQUIRE(b->Items("s") ==
          std::vector<std::string>{"0", "1", "2", "3", "4", "5"});
}

TEST_CASE("Over-long call ids are refused and never stored", "[sandbox]") {
  SessionManager manager(FakeWorkerOptions());
  auto sink = std::make_shared<ItemsSink>();
  const std::string id(kMaxCallIdBytes + 1, 'i');
  manager.HandleHostEvent(sink, Start(id, "fake::echo", "x"));
  auto e = sink->AwaitTerminal("").error().error();
  REQUIRE(e.type() == "BadRequest");
  REQUIRE(e.code() == static_cast<int>(absl::StatusCode::kInvalidArgument));
  REQUIRE(e.message().find("exceeds the limit of 256") != std::string::npos);
  REQUIRE(sink->CountTerminal(id) == 0);  // never echoed back
  REQUIRE(manager.Info().calls_in_flight == 0);
  // Nor are they stored by chunks or resumes.
  auto other = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(other, Chunk(id, "x"));
  REQUIRE(other->AwaitTerminal("").error().error().type() == "BadRequest");
  auto third = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(third, ResumeEvent({id}));
  REQUIRE(third->AwaitTerminal("").error().error().type() == "BadRequest");
  // The limit itself is accepted, and the daemon keeps serving.
  const std::string longest(kMaxCallIdBytes, 'k');
  manager.HandleHostEvent(sink, Start(longest, "fake::echo", "ok"));
  REQUIRE(sink->AwaitTerminal(longest).result().value() == "ok");
}

TEST_CASE("An upload that stops arriving fails with UploadTimeout",
          "[sandbox]") {
  SessionOptions options = FakeWorkerOptions();
  options.upload_idle_timeout = absl::Milliseconds(200);
  SessionManager manager(options);
  auto sink = std::make_shared<ItemsSink>();
  // Announces 1 GiB, sends 3 bytes, then nothing.
  manager.HandleHostEvent(sink, Start("stuck", "fake::echo", "abc", 1 << 30));
  // One that keeps making progress is not cut.
  manager.HandleHostEvent(sink, Start("slow", "fake::echo", "a", 4));
  for (const char* piece : {"b", "c"}) {
    absl::SleepFor(absl::Milliseconds(120));
    manager.HandleHostEvent(sink, Chunk("slow", piece));
  }
  absl::SleepFor(absl::Milliseconds(120));
  manager.HandleHostEvent(sink, Chunk("slow", "d"));
  REQUIRE(sink->AwaitTerminal("slow").result().value() == "abcd");
  auto e = sink->AwaitTerminal("stuck").error().error();
  REQUIRE(e.type() == "UploadTimeout");
  REQUIRE(e.code() == static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  REQUIRE(sink->CountTerminal("stuck") == 1);
  REQUIRE(manager.Info().calls_in_flight == 0);
  // Late chunks of the failed upload change nothing.
  manager.HandleHostEvent(sink, Chunk("stuck", "more"));
  manager.HandleHostEvent(sink, Start("after", "fake::echo", "served"));
  REQUIRE(sink->AwaitTerminal("after").result().value() == "served");
  REQUIRE(sink->CountTerminal("stuck") == 1);
}

TEST_CASE("A queued call whose upload stalls fails and frees its slot",
          "[sandbox]") {
  SessionOptions options = FakeWorkerOptions();
  options.upload_idle_timeout = absl::Milliseconds(100);
  options.max_concurrent_calls = 1;
  SessionManager manager(options);
  auto sink = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(sink, Start("busy", "fake::sleep", "300"));
  manager.HandleHostEvent(sink, Start("waiting", "fake::echo", "xy", 100));
  REQUIRE(sink->AwaitTerminal("waiting").error().error().type() ==
          "UploadTimeout");
  REQUIRE(sink->AwaitTerminal("busy").result().value() == "done");
  REQUIRE(manager.Info().calls_queued == 0);
}

// A stream whose host never reads: what it is handed stays unwritten (and
// counted in the manager's total, as the real writer does) until Abort.
class StalledSink : public ItemsSink {
 public:
  explicit StalledSink(std::shared_ptr<std::atomic<int64_t>> total)
      : total_(std::move(total)) {}
  bool Deliver(std::vector<SandboxEventPtr> events) override {
    if (aborted_) return false;
    for (const auto& e : events) {
      unwritten_ += e->ByteSizeLong();
      *total_ += static_cast<int64_t>(e->ByteSizeLong());
    }
    return RecordingSink::Deliver(std::move(events));
  }
  size_t UnwrittenBytes() override { return unwritten_; }
  void Abort(const std::string& message) override {
    aborted_ = true;
    message_ = message;
    *total_ -= static_cast<int64_t>(unwritten_.exchange(0));
  }
  bool aborted() const { return aborted_; }
  std::string message() const { return message_; }

 private:
  const std::shared_ptr<std::atomic<int64_t>> total_;
  std::atomic<size_t> unwritten_{0};
  std::atomic<bool> aborted_{false};
  std::string message_;
};

TEST_CASE("Unwritten results are bounded: the worker waits, a stalled "
          "stream is ended",
          "[sandbox]") {
  SessionOptions options = FakeWorkerOptions();
  options.max_retained_bytes = 64 << 10;
  options.stalled_host_timeout = absl::Milliseconds(300);
  SessionManager manager(options);
  auto stalled = std::make_shared<StalledSink>(manager.unwritten_result_bytes());
  manager.RegisterSink(stalled);
  const std::string big(40 << 10, 'b');  // 160 KiB in all: over the bound
  const absl::Time start = absl::Now();
  for (int i = 0; i < 4; ++i) {
    manager.HandleHostEvent(stalled,
                            Start("big" + std::to_string(i), "fake::echo", big));
  }
  // Handed over, never written: past the bound the worker's output waits.
  while (*manager.unwritten_result_bytes() <= int64_t{64 << 10}) {
    REQUIRE(absl::Now() - start < absl::Seconds(10));
    absl::SleepFor(absl::Milliseconds(1));
  }
  // A reading host's call waits behind the paused worker output, then is
  // answered once the stalled stream has been ended.
  auto reader = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(reader, Start("small", "fake::echo", "hi"));
  REQUIRE(reader->AwaitTerminal("small").result().value() == "hi");
  REQUIRE(stalled->aborted());
  REQUIRE(absl::Now() - start >= absl::Milliseconds(300));
  REQUIRE(stalled->message().find("did not read") != std::string::npos);
  // Once ended, nothing of that stream is left unwritten.
  REQUIRE(*manager.unwritten_result_bytes() == 0);
  manager.DetachSink(stalled.get());
  // The stalled host's calls were retained (within the bound) for resume.
  auto resumed = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(resumed, ResumeEvent({"big3"}));
  REQUIRE(resumed->AwaitTerminal("big3").has_result());
}

TEST_CASE("Shutdown fails running calls and refuses new ones", "[sandbox]") {
  SessionManager manager(FakeWorkerOptions());
  auto sink = std::make_shared<ItemsSink>();
  manager.HandleHostEvent(sink, Start("h", "fake::hang"));
  manager.HandleHostEvent(sink, Start("p", "fake::pid"));
  sink->AwaitTerminal("p");
  manager.Shutdown(absl::Seconds(2));
  REQUIRE(sink->AwaitTerminal("h").error().error().type() == "WorkerDied");
  manager.HandleHostEvent(sink, Start("late", "fake::echo"));
  REQUIRE(sink->AwaitTerminal("late").error().error().type() ==
          "Unavailable");
}

}  // namespace
}  // namespace agentix::sandbox
