#include "calls/owner_scenarios.h"

#include <catch2/catch.hpp>

#include "absl/time/clock.h"
#include "worker/ipc/chunking.h"

namespace agentix::calls::testing {
namespace {

using runtime::v1::CallsRequest;
using runtime::v1::SandboxEvent;

constexpr absl::Duration kWait = absl::Seconds(10);

CallsRequest Start(const std::string& id, const std::string& callable,
                   const std::string& args = "", uint64_t total = 0,
                   uint32_t window = 0) {
  CallsRequest r;
  auto* s = r.add_events()->mutable_start();
  s->set_call_id(id);
  s->set_callable(callable);
  // The fake worker's arguments are raw text, not a pickle.
  s->set_encoding(runtime::v1::ENCODING_PICKLE);
  s->set_arguments(args);
  s->set_arguments_size(total);
  s->set_stream_window(window);
  return r;
}

CallsRequest Chunk(const std::string& id, const std::string& data,
                   std::optional<uint64_t> offset = std::nullopt) {
  CallsRequest r;
  auto* c = r.add_events()->mutable_argument_chunk();
  c->set_call_id(id);
  c->set_data(data);
  if (offset) c->set_offset(*offset);
  return r;
}

CallsRequest Cancel(const std::string& id) {
  CallsRequest r;
  r.add_events()->mutable_cancel()->set_call_id(id);
  return r;
}

CallsRequest Resume(const std::vector<std::string>& ids) {
  CallsRequest r;
  for (const auto& id : ids) r.add_events()->mutable_resume()->add_call_ids(id);
  return r;
}

CallsRequest Ack(const std::string& id) {
  CallsRequest r;
  r.add_events()->mutable_ack()->set_call_id(id);
  return r;
}

CallsRequest StreamAck(const std::string& id, uint64_t next) {
  CallsRequest r;
  auto* a = r.add_events()->mutable_stream_ack();
  a->set_call_id(id);
  a->set_next_index(next);
  return r;
}

std::string ErrorType(const SandboxEvent& e) {
  return e.has_error() ? e.error().error().type() : "";
}

// A call finished on `conn` after everything sent before it was applied.
void Barrier(OwnerUnderTest& owner, const std::shared_ptr<EventLog>& conn,
             const std::string& id) {
  owner.Send(conn, Start(id, "fake::echo", "b"));
  REQUIRE(conn->AwaitTerminal(id).has_result());
}

struct Scenario {
  const char* name;
  std::function<void(CallTableLimits&)> limits;
  std::function<void(OwnerUnderTest&)> run;
};

void NoLimits(CallTableLimits&) {}

std::vector<Scenario> Scenarios() {
  return {
      {"a call's result goes to the connection that started it", NoLimits,
       [](OwnerUnderTest& owner) {
         auto a = owner.Connect();
         auto b = owner.Connect();
         owner.Send(a, Start("c1", "fake::echo", "hello"));
         SandboxEvent e = a->AwaitTerminal("c1");
         REQUIRE(e.result().value() == "hello");
         REQUIRE(e.result().value_size() == 5);
         Barrier(owner, b, "b1");
         REQUIRE(b->CountTerminal("c1") == 0);
       }},
      {"exactly one terminal event; a duplicate start runs nothing", NoLimits,
       [](OwnerUnderTest& owner) {
         auto a = owner.Connect();
         owner.Send(a, Start("d", "fake::double"));
         REQUIRE(a->AwaitTerminal("d").result().value() == "first");
         owner.Send(a, Start("d", "fake::double"));
         Barrier(owner, a, "after");
         REQUIRE(a->CountTerminal("d") == 1);
       }},
      {"a re-sent StartCall never runs a call twice", NoLimits,
       [](OwnerUnderTest& owner) {
         auto a = owner.Connect();
         owner.Send(a, Start("e", "fake::echo", "x"));
         REQUIRE(a->AwaitTerminal("e").has_result());
         owner.Send(a, Ack("e"));
         auto b = owner.Connect();  // a reconnect re-sends the start
         owner.Send(b, Start("e", "fake::echo", "x"));
         SandboxEvent again = b->AwaitTerminal("e");
         REQUIRE(ErrorType(again) == "ResultUnavailable");
         REQUIRE(again.error().error().code() ==
                 int(absl::StatusCode::kNotFound));
         // A running call's re-sent start is ignored: it ends once.
         owner.Send(a, Start("h", "fake::hang"));
         owner.Send(b, Start("h", "fake::hang"));
         owner.Send(b, Cancel("h"));
         REQUIRE(ErrorType(a->AwaitTerminal("h")) == "Cancelled");
         Barrier(owner, a, "after");
         REQUIRE(a->CountTerminal("h") == 1);
         REQUIRE(b->CountTerminal("h") == 0);
       }},
      {"cancel ends a call with Cancelled, whoever sent it; the owner is told",
       NoLimits,
       [](OwnerUnderTest& owner) {
         auto a = owner.Connect();
         auto b = owner.Connect();
         owner.Send(a, Start("h", "fake::hang"));
         owner.Send(b, Cancel("h"));
         SandboxEvent e = a->AwaitTerminal("h");
         REQUIRE(ErrorType(e) == "Cancelled");
         REQUIRE(e.error().error().cancelled());
         REQUIRE(e.error().error().code() == int(absl::StatusCode::kCancelled));
         owner.Send(a, Cancel("h"));     // finished: nothing
         owner.Send(a, Cancel("nope"));  // unknown: nothing
         Barrier(owner, a, "after");
         REQUIRE(a->CountTerminal("h") == 1);
         REQUIRE(b->CountTerminal("h") == 0);
       }},
      {"resume re-attaches running calls and replays retained results",
       NoLimits,
       [](OwnerUnderTest& owner) {
         auto a = owner.Connect();
         owner.Send(a, Start("h", "fake::hang"));
         owner.Send(a, Start("r", "fake::echo", "kept"));
         REQUIRE(a->AwaitTerminal("r").has_result());
         owner.Close(a);
         auto b = owner.Connect();
         owner.Send(b, Resume({"h", "r", "unknown"}));
         REQUIRE(b->AwaitTerminal("r").result().value() == "kept");
         REQUIRE(ErrorType(b->AwaitTerminal("unknown")) ==
                 "ResultUnavailable");
         // Resuming again on the same connection replays nothing twice.
         owner.Send(b, Resume({"r"}));
         owner.Send(b, Cancel("h"));
         REQUIRE(ErrorType(b->AwaitTerminal("h")) == "Cancelled");
         REQUIRE(b->CountTerminal("r") == 1);
         REQUIRE(a->CountTerminal("h") == 0);
       }},
      {"retained results are bounded by count; an evicted one is "
       "ResultUnavailable",
       [](CallTableLimits& l) { l.max_retained_results = 2; },
       [](OwnerUnderTest& owner) {
         auto a = owner.Connect();
         for (const char* id : {"b1", "b2", "b3"}) {
           owner.Send(a, Start(id, "fake::echo", id));
           REQUIRE(a->AwaitTerminal(id).has_result());
         }
         auto b = owner.Connect();
         owner.Send(b, Resume({"b1", "b3"}));
         REQUIRE(ErrorType(b->AwaitTerminal("b1")) == "ResultUnavailable");
         REQUIRE(b->AwaitTerminal("b3").result().value() == "b3");
         owner.Send(b, Start("b1", "fake::echo", "b1"));  // never runs again
         REQUIRE(ErrorType(b->AwaitTerminal("b1", 2)) == "ResultUnavailable");
       }},
      {"retained results are bounded by bytes too",
       [](CallTableLimits& l) { l.max_retained_bytes = 1000; },
       [](OwnerUnderTest& owner) {
         auto a = owner.Connect();
         const std::string value(600, 'v');
         for (const char* id : {"y1", "y2"}) {
           owner.Send(a, Start(id, "fake::echo", value));
           REQUIRE(a->AwaitTerminal(id).has_result());
         }
         auto b = owner.Connect();
         owner.Send(b, Resume({"y1", "y2"}));
         REQUIRE(ErrorType(b->AwaitTerminal("y1")) == "ResultUnavailable");
         REQUIRE(b->AwaitTerminal("y2").result().value() == value);
       }},
      {"a stream honours its window, acks free items, a resume replays the "
       "unacknowledged ones",
       NoLimits,
       [](OwnerUnderTest& owner) {
         auto a = owner.Connect();
         owner.Send(a, Start("s", "fake::stream", "5", 0, 2));
         REQUIRE(a->AwaitItems("s", 2) == std::vector<std::string>{"0", "1"});
         absl::SleepFor(absl::Milliseconds(200));
         REQUIRE(a->Items("s").size() == 2);
         owner.Send(a, StreamAck("s", 2));
         REQUIRE(a->AwaitItems("s", 4).size() == 4);
         owner.Send(a, StreamAck("s", 4));
         REQUIRE(a->AwaitTerminal("s").result().value() == "end");
         REQUIRE(a->Items("s") ==
                 std::vector<std::string>{"0", "1", "2", "3", "4"});
         auto b = owner.Connect();
         owner.Send(b, Resume({"s"}));
         REQUIRE(b->AwaitTerminal("s").result().value() == "end");
         REQUIRE(b->Items("s") == std::vector<std::string>{"4"});
       }},
      {"a resumed stream gets its replayed items before later ones", NoLimits,
       [](OwnerUnderTest& owner) {
         auto a = owner.Connect();
         owner.Send(a, Start("s", "fake::stream", "6", 0, 2));
         REQUIRE(a->AwaitItems("s", 2).size() == 2);
         owner.Close(a);
         auto b = owner.Connect();
         CallsRequest both = Resume({"s"});
         *both.add_events() = StreamAck("s", 2).events(0);
         owner.Send(b, both);
         REQUIRE(b->AwaitItems("s", 4) ==
                 std::vector<std::string>{"0", "1", "2", "3"});
         owner.Send(b, StreamAck("s", 6));
         REQUIRE(b->AwaitTerminal("s").result().value() == "end");
         REQUIRE(b->Items("s") ==
                 std::vector<std::string>{"0", "1", "2", "3", "4", "5"});
       }},
      {"a huge stream window is capped at max_stream_window",
       [](CallTableLimits& l) { l.max_stream_window = 3; },
       [](OwnerUnderTest& owner) {
         auto a = owner.Connect();
         owner.Send(a, Start("s", "fake::stream", "1000", 0, 4000000000u));
         REQUIRE(a->AwaitItems("s", 3).size() == 3);
         absl::SleepFor(absl::Milliseconds(200));
         REQUIRE(a->Items("s").size() == 3);
         owner.Send(a, Cancel("s"));
         REQUIRE(ErrorType(a->AwaitTerminal("s")) == "Cancelled");
       }},
      {"large arguments and results travel in chunks", NoLimits,
       [](OwnerUnderTest& owner) {
         auto a = owner.Connect();
         std::string payload(3 * ipc::kChunkBytes + 123, '\0');
         for (size_t i = 0; i < payload.size(); ++i) payload[i] = char(i * 7);
         owner.Send(a, Start("big", "fake::echo",
                             payload.substr(0, ipc::kChunkBytes),
                             payload.size()));
         for (size_t off = ipc::kChunkBytes; off < payload.size();
              off += ipc::kChunkBytes) {
           owner.Send(a, Chunk("big", payload.substr(off, ipc::kChunkBytes)));
         }
         SandboxEvent e = a->AwaitTerminal("big");
         REQUIRE(e.result().value_size() == payload.size());
         REQUIRE(e.result().value().size() <= ipc::kChunkBytes);
         REQUIRE(a->Chunks("big") + e.result().value() == payload);
       }},
      {"an upload resumes at its offset on a new connection", NoLimits,
       [](OwnerUnderTest& owner) {
         std::string payload(3000, '\0');
         for (size_t i = 0; i < payload.size(); ++i) payload[i] = char(i * 13);
         auto a = owner.Connect();
         owner.Send(a, Start("u", "fake::echo", payload.substr(0, 100),
                             payload.size()));
         owner.Send(a, Chunk("u", payload.substr(100, 900), 100));
         owner.Close(a);
         auto b = owner.Connect();
         // The host re-sends the start (ignored), resumes, and sends again
         // from where it lost track (the overlap is skipped).
         CallsRequest again = Start("u", "fake::echo", payload.substr(0, 100),
                                    payload.size());
         *again.add_events() = Resume({"u"}).events(0);
         *again.add_events() = Chunk("u", payload.substr(500), 500).events(0);
         owner.Send(b, again);
         REQUIRE(b->AwaitTerminal("u").result().value() == payload);
       }},
      {"no argument bytes mean no arguments", NoLimits,
       [](OwnerUnderTest& owner) {
         auto a = owner.Connect();
         owner.Send(a, Start("n", "fake::echo"));
         REQUIRE(a->AwaitTerminal("n").result().value() ==
                 std::string("\x80\x02)}\x86.", 6));
       }},
      {"malformed events get BadRequest and change nothing else", NoLimits,
       [](OwnerUnderTest& owner) {
         auto a = owner.Connect();
         CallsRequest kindless;
         kindless.add_events();
         owner.Send(a, kindless);
         REQUIRE(ErrorType(a->AwaitAnonymousError(1)) == "BadRequest");
         owner.Send(a, Start("", "fake::echo", "x"));
         REQUIRE(ErrorType(a->AwaitAnonymousError(2)) == "BadRequest");
         const std::string long_id(kMaxCallIdBytes + 1, 'i');
         owner.Send(a, Start(long_id, "fake::echo", "x"));
         SandboxEvent too_long = a->AwaitAnonymousError(3);
         REQUIRE(ErrorType(too_long) == "BadRequest");
         REQUIRE(too_long.error().error().message().find("257 bytes") !=
                 std::string::npos);
         owner.Send(a, Chunk("ghost", "x"));
         REQUIRE(ErrorType(a->AwaitTerminal("ghost")) == "BadRequest");
         // Not a pickle under ENCODING_UNSPECIFIED; more bytes than announced.
         CallsRequest msgpack = Start("m", "fake::echo", "\x92\x90\x80");
         msgpack.mutable_events(0)->mutable_start()->set_encoding(
             runtime::v1::ENCODING_UNSPECIFIED);
         owner.Send(a, msgpack);
         REQUIRE(ErrorType(a->AwaitTerminal("m")) == "BadRequest");
         owner.Send(a, Start("over", "fake::echo", "abcdef", 3));
         REQUIRE(ErrorType(a->AwaitTerminal("over")) == "BadRequest");
         // A gap in an upload ends its call, once; later chunks are quiet.
         owner.Send(a, Start("gap", "fake::echo", "ab", 10));
         owner.Send(a, Chunk("gap", "zz", 5));
         REQUIRE(ErrorType(a->AwaitTerminal("gap")) == "BadRequest");
         owner.Send(a, Chunk("gap", "cdefghij", 2));
         owner.Send(a, Chunk("m", "more"));  // a refused call's chunk
         Barrier(owner, a, "after");
         REQUIRE(a->CountTerminal("gap") == 1);
         REQUIRE(a->CountTerminal("m") == 1);
       }},
      {"arguments over max_payload_bytes are PayloadTooLarge",
       [](CallTableLimits& l) { l.max_payload_bytes = 1000; },
       [](OwnerUnderTest& owner) {
         auto a = owner.Connect();
         owner.Send(a, Start("p", "fake::echo", "x", 2000));
         SandboxEvent e = a->AwaitTerminal("p");
         REQUIRE(ErrorType(e) == "PayloadTooLarge");
         REQUIRE(e.error().error().code() ==
                 int(absl::StatusCode::kResourceExhausted));
         owner.Send(a, Chunk("p", std::string(1999, 'y')));  // quiet
         owner.Send(a, Start("fits", "fake::echo", std::string(1000, 'f')));
         REQUIRE(a->AwaitTerminal("fits").has_result());
         REQUIRE(a->CountTerminal("p") == 1);
       }},
      {"an upload that stops arriving fails with UploadTimeout",
       [](CallTableLimits& l) {
         l.upload_idle_timeout = absl::Milliseconds(300);
       },
       [](OwnerUnderTest& owner) {
         auto a = owner.Connect();
         owner.Send(a, Start("slow", "fake::echo", "0123456789", 100));
         SandboxEvent e = a->AwaitTerminal("slow");
         REQUIRE(ErrorType(e) == "UploadTimeout");
         REQUIRE(e.error().error().code() ==
                 int(absl::StatusCode::kDeadlineExceeded));
         owner.Send(a, Chunk("slow", std::string(90, 'z')));  // too late
         Barrier(owner, a, "after");
         REQUIRE(a->CountTerminal("slow") == 1);
       }},
  };
}

}  // namespace

void EventLog::Add(std::vector<SandboxEventPtr> events) {
  absl::MutexLock lock(&mu_);
  for (auto& e : events) events_.push_back(std::move(e));
}

std::vector<const SandboxEvent*> EventLog::Terminals(const std::string& id) {
  std::vector<const SandboxEvent*> out;
  for (const auto& e : events_) {
    if ((e->has_result() && e->result().call_id() == id) ||
        (e->has_error() && e->error().call_id() == id)) {
      out.push_back(e.get());
    }
  }
  return out;
}

SandboxEvent EventLog::AwaitTerminal(const std::string& id, int n) {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return Terminals(id).size() >= static_cast<size_t>(n);
  };
  mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
  auto terminals = Terminals(id);
  return terminals.size() >= static_cast<size_t>(n) ? *terminals[n - 1]
                                                     : SandboxEvent();
}

SandboxEvent EventLog::AwaitAnonymousError(int n) {
  return AwaitTerminal("", n);
}

int EventLog::CountTerminal(const std::string& id) {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(Terminals(id).size());
}

std::vector<std::string> EventLog::ItemsLocked(const std::string& id) {
  std::vector<std::string> out;
  for (const auto& e : events_) {
    if (e->has_stream_item() && e->stream_item().call_id() == id) {
      out.push_back(e->stream_item().value());
    }
  }
  return out;
}

std::vector<std::string> EventLog::Items(const std::string& id) {
  absl::MutexLock lock(&mu_);
  return ItemsLocked(id);
}

std::vector<std::string> EventLog::AwaitItems(const std::string& id, size_t n) {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ItemsLocked(id).size() >= n;
  };
  mu_.AwaitWithTimeout(absl::Condition(&enough), kWait);
  return ItemsLocked(id);
}

std::string EventLog::Chunks(const std::string& id) {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& e : events_) {
    if (e->has_result_chunk() && e->result_chunk().call_id() == id) {
      out += e->result_chunk().data();
    }
  }
  return out;
}

void RunOwnerScenarios(const OwnerFactory& make) {
  for (const Scenario& scenario : Scenarios()) {
    DYNAMIC_SECTION(scenario.name) {
      CallTableLimits limits;
      scenario.limits(limits);
      std::unique_ptr<OwnerUnderTest> owner = make(limits);
      scenario.run(*owner);
    }
  }
}

}  // namespace agentix::calls::testing
