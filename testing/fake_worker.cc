// fake_worker: a stand-in for agentix-worker that speaks the frame protocol
// (docs/WORKER-PROTOCOL.md) without Python, so the daemon can be tested on
// its own. Behaviour is chosen by the callable name:
//   fake::echo     returns the argument bytes (chunked when large)
//   fake::sleep    returns "done" after <arguments> milliseconds
//   fake::hang     never answers (until cancelled)
//   fake::late     answers after 200 ms even if cancelled (a late frame)
//   fake::double   sends two results for one call
//   fake::error    fails with ValueError
//   fake::error_state  fails with ValueError carrying type_module/qualname
//                  and a state of <arguments> bytes (unbounded, as a hostile
//                  worker could)
//   fake::exit     exits with code <arguments>
//   fake::kill     SIGKILLs itself
//   fake::crash    writes a crash report ("Fatal Python error: ..." and
//                  <arguments> lines of stack) to stderr, then SIGKILLs itself
//   fake::garbage  writes a frame that is not msgpack
//   fake::bad_ring answers with a ring reference outside the payload ring
//   fake::pid      returns its own pid as text
//   fake::env      returns the value of the environment variable named
//                  <arguments>, or "<unset>"
//   fake::log      sends a log record "<arguments>" (logger "fake"), then
//                  returns "logged"
//   fake::logs     arguments "N:GAP_US[:PAD]": sends N log records "0", "1",
//                  ... (each followed by a space and PAD 'x's when PAD is
//                  given) each in its own write, GAP_US microseconds apart,
//                  then returns "logged"
//   fake::stream   streams <arguments> items "0", "1", ... honouring the
//                  call's stream window and stream_ack frames, then "end"
// A namespace event from a host is echoed back as "<event>:result".
// FAKE_WORKER_BOOT=fail|exit|hang simulates a worker that cannot start.
// A set_env frame's entries are applied with setenv and answered with
// env_set; FAKE_WORKER_SET_ENV=refuse answers with an error detail instead,
// =ignore never answers.
// FAKE_WORKER_DIRECT=1 advertises the direct-calls capability in `ready`
// and serves each handed-over Calls connection (direct_conn) itself: every
// StartCall gets a CallResult "direct <pid>" (fake::kill SIGKILLs the
// fake), HALF_CLOSE gets STATUS 0; it then (or at EOF) closes the socket
// and its ring memfd and reports direct_closed. Without it, a direct_conn
// is refused as agentix-worker refuses it: STATUS 14, close, direct_closed.
// On shutdown, each direct connection gets STATUS 14. A direct
// fake::sleep runs <arguments> ms; each direct result is retained per
// client until acked (then a finished id). `collapse{client}` ends that
// client's direct connections with STATUS 14 and answers session_state
// (retained results, running sleeps, finished ids); a sleep collapsed while
// running answers on the link. FAKE_WORKER_COLLAPSE=ignore never answers.
// A direct call is written in the payload area's ledger (when the daemon
// made one) as agentix-worker's sessions write it: running when its start
// is read, retained at its result, finished at the host's AckResult, freed
// at a collapse. Direct fake::hang never answers (it stays running); direct
// fake::ledger_garbage also writes a running slot for id "ghost" of a client
// slot the daemon never assigned (the daemon must skip it) and answers as
// any call.
// A direct StartCall of fake::log sends, as agentix-worker does (stage 5),
// a log record "<arguments>" of that call tagged with the connection's
// number, then barrier_ask, and writes the call's result ("logged") with
// the seqs of the daemon's barrier answer; fake::log_untagged the same
// with a record that names no call (untagged: true); any other StartCall
// asks nothing.
// A calls_cpu_answer is written as a calls-CPU HELLO answer on each direct
// connection that follows changes (direct_conn's follow 2), and on one
// that asked for the first answer only (follow 1) if it got none yet.
// With --payload-fd=N (as the daemon passes it) payloads may arrive in the
// payload area's ring, and result pieces of kRingMinPieceBytes or more are
// sent through it while it has room, as agentix-worker does.
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "agentix/runtime/v1/runtime.pb.h"
#include "base/unique_fd.h"
#include "wire/frame_codec.h"
#include "worker/ipc/descriptors.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/io.h"
#include "worker/ipc/ledger.h"
#include "worker/ipc/payload_area.h"
#include "worker/ipc/session_state.h"

namespace {

using agentix::ipc::Frame;
using agentix::ipc::FrameType;
using Clock = std::chrono::steady_clock;

constexpr int kFd = agentix::ipc::kWorkerChannelFd;
std::unique_ptr<agentix::ipc::PayloadArea> payloads;
// The direct calls' ledger in `payloads` (null: the daemon made none), and
// each direct call's slot in it.
std::unique_ptr<agentix::ipc::LedgerWriter> ledger;
std::map<std::string, uint32_t> ledger_slots;

void Send(const Frame& f) {
  std::string out;
  if (!agentix::ipc::AppendFrame(f, out).ok()) std::abort();
  if (!agentix::ipc::WriteAll(kFd, out).ok()) std::exit(0);
}

void SendResult(const std::string& id, const std::string& value) {
  // A piece goes into the ring when it is large and fits, inline otherwise.
  auto place = [](Frame& f, std::string_view piece) {
    std::optional<uint64_t> pos;
    if (payloads && piece.size() >= agentix::ipc::kRingMinPieceBytes) {
      pos = payloads->Put(piece);
    }
    if (pos) {
      f.in_ring = true;
      f.ring_pos = *pos;
      f.ring_size = piece.size();
    } else {
      f.data = std::string(piece);
    }
  };
  const std::string_view all(value);
  size_t off = 0;
  while (value.size() - off > agentix::ipc::kChunkBytes) {
    Frame chunk;
    chunk.type = FrameType::kResultChunk;
    chunk.call_id = id;
    place(chunk, all.substr(off, agentix::ipc::kChunkBytes));
    Send(chunk);
    off += agentix::ipc::kChunkBytes;
  }
  Frame r;
  r.type = FrameType::kResult;
  r.call_id = id;
  r.encoding = 1;
  place(r, all.substr(off));
  r.total_size = value.size();
  Send(r);
}

void SendError(const std::string& id, const std::string& type,
               const std::string& message, int code, bool cancelled) {
  Frame e;
  e.type = FrameType::kError;
  e.call_id = id;
  e.error.type = type;
  e.error.message = message;
  e.error.code = code;
  e.error.cancelled = cancelled;
  e.error.traceback = "fake traceback";
  Send(e);
}

struct Pending {
  std::string callable;
  std::string args;
  uint64_t total = 0;
  uint32_t window = 0;
};

// A fake::stream call in progress.
struct Stream {
  uint64_t count = 0;   // items to produce
  uint64_t next = 0;    // next index to send
  uint64_t acked = 0;   // from the last stream_ack
  uint32_t window = 1;
};

// Sends what the window allows; returns true once the stream has ended.
bool Pump(const std::string& id, Stream& s) {
  while (s.next < s.count && s.next < s.acked + s.window) {
    Frame item;
    item.type = FrameType::kStreamItem;
    item.call_id = id;
    item.index = s.next;
    item.encoding = 1;
    item.data = std::to_string(s.next);
    Send(item);
    ++s.next;
  }
  if (s.next < s.count) return false;
  SendResult(id, "end");
  return true;
}

// A client's direct calls (FAKE_WORKER_DIRECT=1), until a collapse.
struct DirectSession {
  std::map<std::string, std::string> retained;  // id -> serialized event
  std::set<std::string> running;                // fake::sleep calls
  std::vector<std::string> finished;            // acked ids
};
std::map<std::string, DirectSession> sessions;  // by client id

// A Calls connection the daemon handed over (FAKE_WORKER_DIRECT=1).
struct DirectConn {
  uint64_t conn = 0;
  std::string client;
  uint32_t client_slot = 0;  // the daemon's, in the ledger
  uint32_t follow = 0;
  agentix::base::UniqueFd socket;
  agentix::base::UniqueFd ring;  // the host's ring memfd, held only
  std::string in;                // unparsed frame-wire bytes
};

void WriteToHost(int fd, const std::string& bytes) {
  size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return;  // the host is gone: its EOF ends the connection
    at += static_cast<size_t>(n);
  }
}

void SendStatus(int fd, absl::StatusCode code, const std::string& details) {
  WriteToHost(fd, agentix::sandbox::EncodeFrame(
                      agentix::sandbox::FrameKind::kStatus,
                      agentix::sandbox::EncodeStatus(code, details)));
}

void SendDirectClosed(uint64_t conn, const std::string& why) {
  Frame closed;
  closed.type = FrameType::kDirectClosed;
  closed.direct_conn.conn = conn;
  closed.detail = why;
  Send(closed);
}

std::string DirectResultEvent(const std::string& id, int encoding,
                              const std::string& value) {
  agentix::runtime::v1::SandboxEvent event;
  auto* result = event.mutable_result();
  result->set_call_id(id);
  result->set_encoding(static_cast<agentix::runtime::v1::Encoding>(encoding));
  result->set_value(value);
  result->set_value_size(value.size());
  return event.SerializeAsString();
}

// Writes one retained event to the host as a CallsResponse.
void WriteEvent(int fd, const std::string& serialized) {
  agentix::runtime::v1::CallsResponse response;
  response.add_events()->ParseFromString(serialized);
  WriteToHost(fd, agentix::sandbox::EncodeFrame(
                      agentix::sandbox::FrameKind::kMessage,
                      response.SerializeAsString()));
}

// A running call slot (the ledger's last: LedgerWriter fills the lowest
// first) for id "ghost" of client slot 4000, which no daemon test assigns.
void WriteGarbageLedgerSlot(absl::Span<char> region) {
  if (region.size() < agentix::ipc::kLedgerHeaderBytes) return;
  uint32_t call_slots;
  std::memcpy(&call_slots, region.data() + 8, sizeof call_slots);
  if (call_slots == 0 ||
      agentix::ipc::kLedgerHeaderBytes +
              size_t{call_slots} * agentix::ipc::kLedgerCallSlotBytes >
          region.size()) {
    return;
  }
  char* slot = region.data() + agentix::ipc::kLedgerHeaderBytes +
               size_t{call_slots - 1} * agentix::ipc::kLedgerCallSlotBytes;
  const uint32_t running = 1;
  const uint32_t client_slot = 4000;
  const uint16_t length = 5;
  std::memcpy(slot + 16, "ghost", length);
  std::memcpy(slot + 4, &client_slot, sizeof client_slot);
  std::memcpy(slot + 8, &length, sizeof length);
  std::memcpy(slot, &running, sizeof running);
}

// Direct calls' results waiting for the daemon's barrier: the host socket
// and the CallsResponse to stamp and write.
std::map<std::string, std::pair<int, agentix::runtime::v1::CallsResponse>>
    awaiting_barrier;

// A fake::log or fake::log_untagged StartCall of a direct connection: the
// record, the ask, and the result parked until the answer.
void LogDirect(const DirectConn& d, const agentix::runtime::v1::StartCall& start) {
  const bool untagged = start.callable() == "fake::log_untagged";
  agentix::runtime::v1::LogRecord record;
  record.set_logger("fake");
  record.set_level(30);
  record.set_level_name("WARNING");
  record.set_message(start.arguments());
  if (!untagged) record.set_call_id(start.call_id());
  Frame log;
  log.type = FrameType::kLog;
  log.record = record.SerializeAsString();
  log.direct_conn.conn = d.conn;
  Send(log);
  Frame ask;
  ask.type = FrameType::kBarrierAsk;
  ask.call_id = start.call_id();
  ask.untagged = untagged;
  Send(ask);
  agentix::runtime::v1::CallsResponse response;
  auto* result = response.add_events()->mutable_result();
  result->set_call_id(start.call_id());
  result->set_encoding(start.encoding());
  result->set_value("logged");
  result->set_value_size(result->value().size());
  awaiting_barrier[start.call_id()] = {d.socket.get(), std::move(response)};
}

// Handles what the host sent; false once the connection is over (its
// STATUS written, or a bad frame). A fake::sleep is timed by `sleep`.
template <typename Sleep>
bool ServeDirect(DirectConn& d, Sleep sleep) {
  DirectSession& session = sessions[d.client];
  using agentix::sandbox::FrameKind;
  for (;;) {
    auto frame = agentix::sandbox::ParseFrame(d.in);
    if (!frame.ok()) {
      SendStatus(d.socket.get(), absl::StatusCode::kInvalidArgument,
                 std::string(frame.status().message()));
      return false;
    }
    if (frame->frame_bytes == 0) return true;
    const FrameKind kind = frame->kind;
    agentix::runtime::v1::CallsRequest request;
    const bool parsed =
        kind == FrameKind::kMessage &&
        request.ParseFromArray(frame->payload.data(),
                               static_cast<int>(frame->payload.size()));
    d.in.erase(0, frame->frame_bytes);
    if (kind == FrameKind::kHalfClose) {
      SendStatus(d.socket.get(), absl::StatusCode::kOk, "");
      return false;
    }
    if (!parsed) continue;
    agentix::runtime::v1::CallsResponse response;
    for (const auto& event : request.events()) {
      if (event.has_ack()) {
        const std::string& acked = event.ack().call_id();
        if (session.retained.erase(acked) > 0) session.finished.push_back(acked);
        auto slot = ledger_slots.find(acked);
        if (ledger && slot != ledger_slots.end()) {
          ledger->Finished(slot->second);
          ledger_slots.erase(slot);
        }
        continue;
      }
      if (!event.has_start()) continue;
      const std::string& id = event.start().call_id();
      if (session.retained.count(id) || session.running.count(id)) continue;
      if (ledger && ledger_slots.count(id) == 0) {
        if (auto slot = ledger->Started(d.client_slot, id)) {
          ledger_slots[id] = *slot;
        }
      }
      const std::string& callable = event.start().callable();
      if (callable == "fake::kill") raise(SIGKILL);
      if (callable == "fake::hang") {
        session.running.insert(id);
        continue;
      }
      if (callable == "fake::log" || callable == "fake::log_untagged") {
        LogDirect(d, event.start());
        continue;
      }
      if (callable == "fake::sleep") {
        session.running.insert(id);
        sleep(id, std::atoi(event.start().arguments().c_str()));
        continue;
      }
      if (callable == "fake::ledger_garbage" && payloads) {
        WriteGarbageLedgerSlot(payloads->Ledger());
      }
      const std::string serialized = DirectResultEvent(
          id, event.start().encoding(), "direct " + std::to_string(getpid()));
      response.add_events()->ParseFromString(serialized);
      session.retained[id] = serialized;
      if (ledger && ledger_slots.count(id) != 0) ledger->Retained(ledger_slots[id]);
    }
    if (response.events_size() > 0) {
      WriteToHost(d.socket.get(),
                  agentix::sandbox::EncodeFrame(FrameKind::kMessage,
                                                response.SerializeAsString()));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string flag = "--payload-fd=";
    if (arg.rfind(flag, 0) == 0) {
      auto area =
          agentix::ipc::PayloadArea::Map(std::atoi(arg.c_str() + flag.size()));
      if (!area.ok()) return 6;
      payloads = std::move(*area);
      if (!payloads->Ledger().empty()) {
        auto opened = agentix::ipc::LedgerWriter::Open(payloads->Ledger());
        if (!opened.ok()) return 6;
        ledger = std::move(*opened);
      }
    }
  }
  signal(SIGPIPE, SIG_IGN);
  const char* boot = std::getenv("FAKE_WORKER_BOOT");
  std::string boot_mode = boot ? boot : "";
  if (boot_mode == "exit") return 4;
  if (boot_mode == "fail") {
    Frame f;
    f.type = FrameType::kBootError;
    f.error.type = "ImportError";
    f.error.message = "no module named 'broken_venv'";
    Send(f);
    return 3;
  }
  if (boot_mode == "hang") {
    pause();
    return 0;
  }
  const char* direct_env = std::getenv("FAKE_WORKER_DIRECT");
  const bool serve_direct = direct_env != nullptr && std::string(direct_env) == "1";
  Frame ready;
  ready.type = FrameType::kReady;
  ready.pid = getpid();
  ready.detail = "fake";
  ready.direct = serve_direct;
  Send(ready);

  agentix::ipc::FrameReader reader;
  agentix::ipc::DescriptorReader descriptors;
  std::map<int, DirectConn> directs;  // by socket descriptor
  auto close_direct = [&](std::map<int, DirectConn>::iterator it,
                          const std::string& why) {
    const uint64_t conn = it->second.conn;
    directs.erase(it);  // closes the socket and the ring memfd
    SendDirectClosed(conn, why);
  };
  std::map<std::string, Pending> assembling;
  // Timed replies: due time -> (call id, value).
  std::multimap<Clock::time_point, std::pair<std::string, std::string>> timers;
  std::set<std::string> cancelled;
  std::map<std::string, Stream> streams;
  auto direct_sleep = [&](const std::string& id, int ms) {
    timers.emplace(Clock::now() + std::chrono::milliseconds(ms),
                   std::make_pair(id, std::string("done")));
  };
  // A direct fake::sleep's end: to its session's host (retained), or, once
  // collapsed, to the link like a relayed call's.
  auto direct_end = [&](const std::string& id, const std::string& value) {
    for (auto& [client, session] : sessions) {
      if (session.running.erase(id) == 0) continue;
      const std::string serialized = DirectResultEvent(id, 1, value);
      session.retained[id] = serialized;
      if (ledger && ledger_slots.count(id) != 0) ledger->Retained(ledger_slots[id]);
      for (const auto& [fd, d] : directs) {
        if (d.client == client) WriteEvent(fd, serialized);
      }
      return true;
    }
    return false;
  };
  auto collapse = [&](const std::string& client) {
    const char* mode = std::getenv("FAKE_WORKER_COLLAPSE");
    if (mode != nullptr && std::string(mode) == "ignore") return;
    for (auto it = directs.begin(); it != directs.end();) {
      auto next = std::next(it);
      if (it->second.client == client) {
        SendStatus(it->first, absl::StatusCode::kUnavailable,
                   "the sandbox daemon took this client's calls back");
        close_direct(it, "collapsed");
      }
      it = next;
    }
    agentix::ipc::SessionState state;
    auto found = sessions.find(client);
    if (found != sessions.end()) {
      for (const auto& [id, event] : found->second.retained) {
        state.calls.push_back({id, false, {event}});
      }
      for (const std::string& id : found->second.running) {
        state.calls.push_back({id, true, {}});
      }
      state.finished = found->second.finished;
      // The daemon owns these calls now: their ledger slots are free, as
      // agentix-worker's Collapse frees them.
      for (const auto& call : state.calls) {
        auto slot = ledger_slots.find(call.id);
        if (ledger && slot != ledger_slots.end()) {
          ledger->Forget(slot->second);
          ledger_slots.erase(slot);
        }
      }
      sessions.erase(found);
    }
    std::vector<std::string> pieces = agentix::ipc::EncodeSessionState(state);
    for (size_t i = 0; i < pieces.size(); ++i) {
      Frame piece;
      piece.type = FrameType::kSessionState;
      piece.direct_conn.client = client;
      piece.record = std::move(pieces[i]);
      piece.last = i + 1 == pieces.size();
      Send(piece);
    }
  };

  auto start = [&](const std::string& id, Pending& p) {
    const std::string& fn = p.callable;
    if (fn == "fake::echo") {
      SendResult(id, p.args);
    } else if (fn == "fake::sleep") {
      timers.emplace(Clock::now() + std::chrono::milliseconds(
                                        std::atoi(p.args.c_str())),
                     std::make_pair(id, std::string("done")));
    } else if (fn == "fake::late") {
      timers.emplace(Clock::now() + std::chrono::milliseconds(200),
                     std::make_pair(id, std::string("late")));
    } else if (fn == "fake::hang") {
    } else if (fn == "fake::double") {
      SendResult(id, "first");
      SendResult(id, "second");
    } else if (fn == "fake::error") {
      SendError(id, "ValueError", "bad value", 2, false);
    } else if (fn == "fake::error_state") {
      Frame e;
      e.type = FrameType::kError;
      e.call_id = id;
      e.error.type = "ValueError";
      e.error.message = "bad value";
      e.error.type_module = "builtins";
      e.error.type_qualname = "ValueError";
      e.error.state.assign(std::strtoul(p.args.c_str(), nullptr, 10), 's');
      Send(e);
    } else if (fn == "fake::exit") {
      std::exit(std::atoi(p.args.c_str()));
    } else if (fn == "fake::kill") {
      raise(SIGKILL);
    } else if (fn == "fake::crash") {
      std::string report =
          "noise before the crash\n"
          "Fatal Python error: Segmentation fault\n\n";
      const long lines = std::strtol(p.args.c_str(), nullptr, 10);
      for (long i = 0; i < lines; ++i) {
        report += "  File \"/app/deep.py\", line " + std::to_string(i) +
                  " in frame\n";
      }
      report += "\nExtension modules: fake (total: 1)\n";
      agentix::ipc::WriteAll(2, report).IgnoreError();
      raise(SIGKILL);
    } else if (fn == "fake::garbage") {
      const char junk[] = "\x03\x00\x00\x00\xc1\xc1\xc1";
      agentix::ipc::WriteAll(kFd, std::string(junk, 7)).IgnoreError();
    } else if (fn == "fake::bad_ring") {
      // A result said to lie in the ring, but past its end.
      Frame r;
      r.type = FrameType::kResult;
      r.call_id = id;
      r.in_ring = true;
      r.ring_pos = uint64_t{1} << 40;
      r.ring_size = uint64_t{1} << 30;
      r.total_size = r.ring_size;
      Send(r);
    } else if (fn == "fake::stream") {
      Stream st;
      st.count = std::strtoull(p.args.c_str(), nullptr, 10);
      st.window = std::max<uint32_t>(1, p.window);
      if (!Pump(id, st)) streams[id] = st;
    } else if (fn == "fake::log") {
      agentix::runtime::v1::LogRecord record;
      record.set_logger("fake");
      record.set_level(30);
      record.set_level_name("WARNING");
      record.set_message(p.args);
      record.set_call_id(id);
      Frame log;
      log.type = FrameType::kLog;
      log.record = record.SerializeAsString();
      Send(log);
      SendResult(id, "logged");
    } else if (fn == "fake::logs") {
      char* rest = nullptr;
      const uint64_t count = std::strtoull(p.args.c_str(), &rest, 10);
      const long gap_us = *rest == ':' ? std::strtol(rest + 1, &rest, 10) : 0;
      const std::string pad =
          *rest == ':' ? " " + std::string(std::strtoul(rest + 1, nullptr, 10), 'x')
                       : "";
      agentix::runtime::v1::LogRecord record;
      record.set_logger("fake");
      record.set_level(20);
      record.set_level_name("INFO");
      record.set_call_id(id);
      Frame log;
      log.type = FrameType::kLog;
      for (uint64_t i = 0; i < count; ++i) {
        record.set_message(std::to_string(i) + pad);
        log.record = record.SerializeAsString();
        Send(log);
        if (gap_us > 0) usleep(static_cast<useconds_t>(gap_us));
      }
      SendResult(id, "logged");
    } else if (fn == "fake::pid") {
      SendResult(id, std::to_string(getpid()));
    } else if (fn == "fake::env") {
      const char* value = std::getenv(p.args.c_str());
      SendResult(id, value != nullptr ? value : "<unset>");
    } else {
      SendError(id, "ModuleNotFoundError", "No module named '" + fn + "'", 3,
                false);
    }
  };

  while (true) {
    int timeout_ms = -1;
    if (!timers.empty()) {
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
          timers.begin()->first - Clock::now());
      timeout_ms = std::max<int>(0, static_cast<int>(wait.count()));
    }
    std::vector<pollfd> pfds{{kFd, POLLIN, 0}};
    for (const auto& [fd, d] : directs) pfds.push_back({fd, POLLIN, 0});
    int rc = poll(pfds.data(), pfds.size(), timeout_ms);
    for (size_t i = 1; rc > 0 && i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      auto it = directs.find(pfds[i].fd);
      char buffer[65536];
      const ssize_t n = ::recv(pfds[i].fd, buffer, sizeof(buffer), MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) {
        close_direct(it, "eof");
        continue;
      }
      it->second.in.append(buffer, static_cast<size_t>(n));
      if (!ServeDirect(it->second, direct_sleep)) {
        close_direct(it, "status written");
      }
    }
    if (rc > 0 && pfds[0].revents == 0) rc = 0;  // only direct sockets
    while (!timers.empty() && timers.begin()->first <= Clock::now()) {
      auto [id, value] = timers.begin()->second;
      timers.erase(timers.begin());
      if (direct_end(id, value)) continue;
      // fake::late answers regardless; others honour cancellation.
      if (!cancelled.count(id) || value == "late") SendResult(id, value);
    }
    if (rc <= 0) continue;
    ssize_t n;
    do {
      n = descriptors.ReadFrom(kFd, reader, 1 << 20);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) return 0;
    while (true) {
      auto next = reader.Next();
      if (!next.ok()) return 5;  // desynchronised
      if (!next->has_value()) break;
      Frame f = std::move(**next);
      auto fds = descriptors.TakeFor(f, reader);
      if (!fds.ok()) return 5;  // the descriptors did not match the frame
      if (f.type == FrameType::kDirectConn) {
        DirectConn d;
        d.conn = f.direct_conn.conn;
        d.client = f.direct_conn.client;
        d.client_slot = f.direct_conn.client_slot;
        d.follow = f.direct_conn.follow;
        d.socket = std::move((*fds)[0]);
        if (fds->size() > 1) d.ring = std::move((*fds)[1]);
        // A Namespace stream (stage 8) is not served here: refused as a
        // worker that cannot take it refuses it.
        if (!serve_direct || !f.direct_conn.ns_name.empty()) {
          SendStatus(d.socket.get(), absl::StatusCode::kUnavailable,
                     "this worker does not serve direct connections");
          d.socket.Reset();
          d.ring.Reset();
          SendDirectClosed(d.conn, "refused: not advertised");
          continue;
        }
        d.in = std::move(f.data);  // what the daemon read past HELLO
        const int fd = d.socket.get();
        auto it = directs.emplace(fd, std::move(d)).first;
        if (!ServeDirect(it->second, direct_sleep)) {
          close_direct(it, "status written");
        }
        continue;
      }
      if (f.type == FrameType::kCollapse) {
        collapse(f.direct_conn.client);
        continue;
      }
      if (f.in_ring) {
        if (!payloads) return 5;
        auto piece = payloads->Get(f.ring_pos, f.ring_size);
        if (!piece.ok()) return 5;
        f.data.assign(piece->data(), piece->size());
        payloads->Release(f.ring_pos + f.ring_size);
      }
      switch (f.type) {
        case FrameType::kCall: {
          Pending p{f.callable, f.data, f.total_size, f.stream_window};
          if (p.args.size() >= p.total) {
            start(f.call_id, p);
          } else {
            assembling[f.call_id] = std::move(p);
          }
          break;
        }
        case FrameType::kArgChunk: {
          auto it = assembling.find(f.call_id);
          if (it == assembling.end()) break;
          it->second.args += f.data;
          if (it->second.args.size() >= it->second.total) {
            Pending p = std::move(it->second);
            assembling.erase(it);
            start(f.call_id, p);
          }
          break;
        }
        case FrameType::kStreamAck: {
          auto it = streams.find(f.call_id);
          if (it == streams.end()) break;
          it->second.acked = std::max(it->second.acked, f.index);
          if (Pump(f.call_id, it->second)) streams.erase(it);
          break;
        }
        case FrameType::kCancel:
          cancelled.insert(f.call_id);
          streams.erase(f.call_id);
          SendError(f.call_id, "Cancelled", "remote call cancelled", 1, true);
          break;
        case FrameType::kSetEnv: {
          // Applies "K=V\0" entries with setenv (FAKE_WORKER_SET_ENV=refuse:
          // answers with an error, =ignore: never answers, =slow: answers
          // 400 ms later).
          const char* mode = std::getenv("FAKE_WORKER_SET_ENV");
          const std::string set_mode = mode ? mode : "";
          if (set_mode == "ignore") break;
          Frame ack;
          ack.type = FrameType::kEnvSet;
          if (set_mode == "refuse") {
            ack.detail = "refused by FAKE_WORKER_SET_ENV";
          } else {
            size_t begin = 0;
            while (begin < f.data.size()) {
              size_t end = f.data.find('\0', begin);
              if (end == std::string::npos) end = f.data.size();
              const std::string entry = f.data.substr(begin, end - begin);
              const size_t eq = entry.find('=');
              if (eq != std::string::npos) {
                setenv(entry.substr(0, eq).c_str(),
                       entry.substr(eq + 1).c_str(), 1);
              }
              begin = end + 1;
            }
          }
          if (set_mode == "slow") usleep(400 * 1000);
          Send(ack);
          break;
        }
        case FrameType::kNamespaceEvent: {
          // Echoes a host's event as "<event>:result" (same request_id and
          // data) on the same namespace; the daemon's own
          // agentix:host_connected is not answered.
          if (f.ns.event == "agentix:host_connected") break;
          Frame reply;
          reply.type = FrameType::kNamespaceEvent;
          reply.ns.name = f.ns.name;
          reply.ns.event = f.ns.event + ":result";
          reply.ns.request_id = f.ns.request_id;
          reply.data = f.data;
          Send(reply);
          break;
        }
        case FrameType::kBarrier: {
          auto it = awaiting_barrier.find(f.call_id);
          if (it == awaiting_barrier.end()) return 5;  // never asked
          auto* result = it->second.second.mutable_events(0)->mutable_result();
          result->set_log_seq(f.log_seq);
          result->set_trace_seq(f.trace_seq);
          WriteToHost(it->second.first,
                      agentix::sandbox::EncodeFrame(
                          agentix::sandbox::FrameKind::kMessage,
                          it->second.second.SerializeAsString()));
          awaiting_barrier.erase(it);
          break;
        }
        case FrameType::kCallsCpuAnswer:
          for (auto& [fd, d] : directs) {
            if (d.follow == 0) continue;
            if (d.follow == 1) d.follow = 0;  // the first answer only
            WriteToHost(fd, agentix::sandbox::EncodeFrame(
                                agentix::sandbox::FrameKind::kHello,
                                agentix::sandbox::EncodeHello(
                                    {{agentix::sandbox::kFrameCallsCpuKey, f.detail}})));
          }
          break;
        case FrameType::kShutdown:
          for (const auto& [fd, d] : directs) {
            SendStatus(fd, absl::StatusCode::kUnavailable,
                       "the sandbox daemon is shutting down");
          }
          return 0;
        default:
          break;
      }
    }
    if (!descriptors.Settle(reader).ok()) return 5;
  }
}
