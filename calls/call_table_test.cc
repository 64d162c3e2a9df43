// CallTable on its own: each promise of docs/RELIABILITY.md "Calls" that the
// table keeps (both owners' shared behaviour is in owner_scenarios).
#include "calls/call_table.h"

#include <catch2/catch.hpp>

namespace agentix::calls {
namespace {

using runtime::v1::SandboxEvent;

struct Stream {};  // a sink: the table compares and keeps it, nothing more
struct NoExtra {};
using Table = CallTable<Stream, NoExtra>;

runtime::v1::StartCall Start(const std::string& id, std::string args = "\x80",
                             uint64_t total = 0) {
  runtime::v1::StartCall s;
  s.set_call_id(id);
  s.set_callable("m:f");
  s.set_arguments(std::move(args));
  s.set_arguments_size(total);
  return s;
}

// Starts `id` for `client` on `sink` as an owner does: the id check, then
// the admission. Null when refused or ignored.
Table::Call* Begin(Table& table, const std::shared_ptr<Stream>& sink,
                   const std::string& client, const runtime::v1::StartCall& s,
                   Table::Out& out) {
  if (!table.IsNewStart(sink, client, s.call_id(), out)) return nullptr;
  return table.Admit(sink, client, s, s.arguments(), out);
}

SandboxEventPtr Result(const std::string& id, std::string value) {
  auto e = std::make_shared<SandboxEvent>();
  e->mutable_result()->set_call_id(id);
  e->mutable_result()->set_value(std::move(value));
  return e;
}

SandboxEventPtr Item(const std::string& id, uint64_t index) {
  auto e = std::make_shared<SandboxEvent>();
  e->mutable_stream_item()->set_call_id(id);
  e->mutable_stream_item()->set_index(index);
  return e;
}

std::string TypeOf(const Table::Delivery& d) {
  return d.event->has_error() ? d.event->error().error().type() : "";
}

TEST_CASE("CallTable: id rules and at most once", "[calls]") {
  Table table(CallTableLimits{});
  auto a = std::make_shared<Stream>();
  auto b = std::make_shared<Stream>();
  Table::Out out;
  REQUIRE(Begin(table, a, "A", Start(""), out) == nullptr);
  REQUIRE(TypeOf(out.back()) == "BadRequest");
  REQUIRE(Begin(table, a, "A", Start(std::string(kMaxCallIdBytes + 1, 'x')),
                out) == nullptr);
  REQUIRE(out.back().event->error().call_id().empty());  // never echoed
  REQUIRE(table.calls().empty());

  Table::Call* call = Begin(table, a, "A", Start("c"), out);
  REQUIRE(call != nullptr);
  out.clear();
  // Its own client re-sending it: ignored. Another client: CallIdInUse.
  REQUIRE(Begin(table, b, "A", Start("c"), out) == nullptr);
  REQUIRE(out.empty());
  REQUIRE(Begin(table, b, "B", Start("c"), out) == nullptr);
  REQUIRE(TypeOf(out.back()) == "CallIdInUse");
  REQUIRE(out.back().sink == b);
  REQUIRE(table.Find("c")->sink == a);  // untouched

  // Acknowledged: a re-sent start is refused, never run again.
  out.clear();
  table.Emit("c", *call, Result("c", "v"), /*terminal=*/true, out);
  REQUIRE(!table.Ack("B", "c"));  // not B's
  REQUIRE(table.Ack("A", "c"));
  REQUIRE(table.IsFinished("c"));
  REQUIRE(Begin(table, a, "A", Start("c"), out) == nullptr);
  REQUIRE(TypeOf(out.back()) == "ResultUnavailable");
}

TEST_CASE("CallTable: exactly one terminal event, retained until acked",
          "[calls]") {
  Table table(CallTableLimits{});
  auto a = std::make_shared<Stream>();
  Table::Out out;
  Table::Call* call = Begin(table, a, "A", Start("c"), out);
  REQUIRE(table.FindOpen("c") == call);
  table.Emit("c", *call, Item("c", 0), false, out);
  table.Emit("c", *call, Result("c", "v"), true, out);
  REQUIRE(out.size() == 2);
  REQUIRE(table.FindOpen("c") == nullptr);  // later output has nowhere to go
  REQUIRE(table.retained_results() == 1);
  REQUIRE(table.retained_bytes() > 0);
  REQUIRE(!table.Ack("A", "nope"));
  REQUIRE(table.Ack("A", "c"));
  REQUIRE(table.retained_results() == 0);
  REQUIRE(table.retained_bytes() == 0);
}

TEST_CASE("CallTable: retention is bounded by count and bytes; evicted ids "
          "are finished", "[calls]") {
  CallTableLimits limits;
  limits.max_retained_results = 2;
  limits.max_retained_bytes = 1000;
  Table table(limits);
  auto a = std::make_shared<Stream>();
  Table::Out out;
  for (const char* id : {"1", "2", "3"}) {
    Table::Call* call = Begin(table, a, "A", Start(id), out);
    table.Emit(id, *call, Result(id, "small"), true, out);
  }
  REQUIRE(table.Find("1") == nullptr);
  REQUIRE(table.IsFinished("1"));
  REQUIRE(table.retained_results() == 2);
  Table::Call* big = Begin(table, a, "A", Start("big"), out);
  table.Emit("big", *big, Result("big", std::string(995, 'b')), true, out);
  // Over the bytes: everything older goes, the newest always stays.
  REQUIRE(table.retained_results() == 1);
  REQUIRE(table.Find("big") != nullptr);
  out.clear();
  runtime::v1::ResumeCalls resume;
  resume.add_call_ids("2");
  table.Resume(a, "A", resume, out);
  REQUIRE(TypeOf(out.back()) == "ResultUnavailable");
}

TEST_CASE("CallTable: eviction follows the order calls ended, acked calls' "
          "places reused", "[calls]") {
  CallTableLimits limits;
  limits.max_retained_results = 2;
  Table table(limits);
  auto a = std::make_shared<Stream>();
  Table::Out out;
  auto finish = [&](const std::string& id) {
    Table::Call* call = Begin(table, a, "A", Start(id), out);
    REQUIRE(call != nullptr);
    table.Emit(id, *call, Result(id, "v"), true, out);
  };
  // Each ack frees a place that a later call reuses; that call is then the
  // newest, not the acked call's old place in the order.
  for (int round = 0; round < 3; ++round) {
    const std::string p = std::to_string(round);
    finish(p + "a");
    finish(p + "b");
    REQUIRE(table.Ack("A", p + "a"));
    finish(p + "c");
    REQUIRE(table.retained_results() == 2);
    finish(p + "d");  // evicts the oldest retained, b
    REQUIRE(table.Find(p + "b") == nullptr);
    REQUIRE(table.IsFinished(p + "b"));
    REQUIRE(table.Find(p + "c") != nullptr);
    REQUIRE(table.Find(p + "d") != nullptr);
    REQUIRE(table.Ack("A", p + "c"));
    REQUIRE(table.Ack("A", p + "d"));
    REQUIRE(table.retained_results() == 0);
  }
  // A long id after short ones: its place holds all of it.
  const std::string long_id(200, 'L');
  finish(long_id);
  finish("x");
  finish("y");  // evicts long_id, found by its whole id
  REQUIRE(table.Find(long_id) == nullptr);
  REQUIRE(table.IsFinished(long_id));
  REQUIRE(table.Find("x") != nullptr);
}

TEST_CASE("CallTable: resume re-attaches and replays; acks of stream items "
          "drop them", "[calls]") {
  Table table(CallTableLimits{});
  auto a = std::make_shared<Stream>();
  auto b = std::make_shared<Stream>();
  Table::Out out;
  Table::Call* call = Begin(table, a, "A", Start("s"), out);
  auto chunk = std::make_shared<SandboxEvent>();
  chunk->mutable_result_chunk()->set_call_id("s");
  table.Emit("s", *call, chunk, false, out);
  table.Emit("s", *call, Item("s", 0), false, out);
  table.Emit("s", *call, Item("s", 1), false, out);
  table.Detach(a.get());
  REQUIRE(call->sink == nullptr);
  out.clear();
  table.Emit("s", *call, Item("s", 2), false, out);
  REQUIRE(out.empty());  // no stream: retained only

  runtime::v1::StreamAck ack;
  ack.set_call_id("s");
  ack.set_next_index(2);
  REQUIRE(table.AckStreamItems("B", ack) == nullptr);  // not B's
  REQUIRE(table.AckStreamItems("A", ack) == call);     // runs: pass it on
  REQUIRE(call->delivered.size() == 1);                // item 2 only

  runtime::v1::ResumeCalls resume;
  resume.add_call_ids("s");
  table.Resume(b, "B", resume, out);
  REQUIRE(TypeOf(out.back()) == "CallIdInUse");
  out.clear();
  table.Resume(b, "A", resume, out);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].sink == b);
  REQUIRE(out[0].event->stream_item().index() == 2);
  REQUIRE(table.HasOpenCalls(b.get()));
  out.clear();
  table.Resume(b, "A", resume, out);  // already live there: no replay
  REQUIRE(out.empty());
}

TEST_CASE("CallTable: uploads — offsets, gaps, overruns, idle uploads",
          "[calls]") {
  CallTableLimits limits;
  limits.max_payload_bytes = 100;
  limits.upload_idle_timeout = absl::Seconds(5);
  Table table(limits);
  auto a = std::make_shared<Stream>();
  Table::Out out;
  REQUIRE(Begin(table, a, "A", Start("p", "\x80", 101), out) == nullptr);
  REQUIRE(TypeOf(out.back()) == "PayloadTooLarge");

  Table::Call* call = Begin(table, a, "A", Start("u", "\x80" "1", 10), out);
  REQUIRE(table.uploading());
  runtime::v1::ArgumentChunk chunk;
  chunk.set_call_id("u");
  chunk.set_offset(0);  // a resumed upload re-sends from 0
  auto update = table.AddChunk(a, "A", chunk, "\x80" "1234", out);
  REQUIRE(update.call == call);
  REQUIRE(update.data == "234");  // the overlap skipped
  REQUIRE(call->args_received == 5);
  chunk.set_offset(7);
  update = table.AddChunk(a, "A", chunk, "x", out);
  REQUIRE(update.failure.find("gap") != std::string::npos);
  chunk.clear_offset();
  update = table.AddChunk(a, "A", chunk, std::string(6, 'x'), out);
  REQUIRE(update.failure.find("exceed") != std::string::npos);
  REQUIRE(table.AddChunk(a, "B", chunk, "x", out).call == nullptr);

  REQUIRE(table.ExpiredUploads(absl::Now()).empty());
  REQUIRE(table.ExpiredUploads(absl::Now() + absl::Seconds(6)) ==
          std::vector<std::string>{"u"});
  REQUIRE(!table.uploading());

  out.clear();
  chunk.set_call_id("ghost");
  REQUIRE(table.AddChunk(a, "A", chunk, "x", out).call == nullptr);
  REQUIRE(TypeOf(out.back()) == "BadRequest");
  out.clear();
  chunk.set_call_id("p");  // refused, so remembered: its chunks are quiet
  REQUIRE(table.AddChunk(a, "A", chunk, "x", out).call == nullptr);
  REQUIRE(out.empty());
}

TEST_CASE("CallTable: worker output over one chunk is cut; windows clamp",
          "[calls]") {
  CallTableLimits limits;
  limits.max_stream_window = 4;
  Table table(limits);
  auto a = std::make_shared<Stream>();
  Table::Out out;
  runtime::v1::StartCall start = Start("w");
  start.set_stream_window(100);
  REQUIRE(table.StreamWindow(start) == 4);
  REQUIRE(MakeCallFrame("w", start, 1, 4).stream_window == 4);
  Table::Call* call = Begin(table, a, "A", start, out);
  ipc::Frame frame;
  frame.type = ipc::FrameType::kStreamItem;
  frame.call_id = "w";
  frame.index = 0;
  frame.data.assign(ipc::kChunkBytes * 2 + 1, 's');
  bool terminal = true;
  out.clear();
  auto event = table.TakeWorkerOutput("w", *call, frame, terminal, out);
  REQUIRE(!terminal);
  REQUIRE(out.size() == 2);
  REQUIRE(out[0].event->result_chunk().data().size() == ipc::kChunkBytes);
  REQUIRE(event->stream_item().value().size() == 1);

  ipc::Frame error;
  error.type = ipc::FrameType::kError;
  error.call_id = "w";
  error.error.type = "ValueError";
  error.error.state.assign(ipc::kMaxExceptionStateBytes + 1, 'x');
  auto failed = table.TakeWorkerOutput("w", *call, error, terminal, out);
  REQUIRE(terminal);
  REQUIRE(failed->error().error().type() == "ValueError");
  REQUIRE(failed->error().error().state().empty());  // over the bound
}

}  // namespace
}  // namespace agentix::calls
