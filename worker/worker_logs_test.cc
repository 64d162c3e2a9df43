// agentix-worker end to end: log records, captured stdio, the durable log.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <msgpack.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "testing/status_matchers.h"
#include "worker/ipc/frame.h"
#include "worker/worker_test_util.h"

namespace agentix::worker {
namespace {

TEST_CASE("logging records become log frames with the call's id",
          "[worker][logs]") {
  auto worker = ReadyWorker();
  const int64_t before = absl::ToUnixNanos(absl::Now());
  worker->Call("lw", "worker_fixture::log_warning", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("lw").ok);
  LogRecord log = AwaitLog(*worker, "app", "x 1");
  CHECK(log.level() == 30);
  CHECK(log.level_name() == "WARNING");
  CHECK(log.call_id() == "lw");
  CHECK(log.origin() == 1);
  CHECK(log.module() == "worker_fixture");
  CHECK(log.function() == "log_warning");
  CHECK(absl::EndsWith(log.file(), "worker_fixture.py"));
  CHECK(log.line() > 0);
  CHECK(log.exception_text().empty());
  CHECK(log.time_unix_nanos() >= before - 1000000000);
  CHECK(log.time_unix_nanos() <= absl::ToUnixNanos(absl::Now()));
  CHECK(absl::StartsWith(log.context(), "sandbox-"));
  CHECK(absl::EndsWith(log.context(), "-worker-test-worker"));
  CHECK(Extras(log.extras()) == std::map<std::string, std::string>{{"k", "1"}});

  worker->Call("le", "worker_fixture::log_exception", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("le").ok);
  log = AwaitLog(*worker, "app", "failed");
  CHECK(log.level_name() == "ERROR");
  CHECK(log.call_id() == "le");
  CHECK(absl::StrContains(log.exception_text(), "Traceback"));
  CHECK(absl::StrContains(log.exception_text(), "ValueError: boom"));

  // A coroutine's records and prints carry its id too.
  worker->Call("la", "worker_fixture::log_async", Pickle("(('t',), {})"));
  REQUIRE(worker->AwaitReply("la").ok);
  CHECK(AwaitLog(*worker, "app.async", "async t").call_id() == "la");
  CHECK(AwaitLog(*worker, kStdout, "async print t").call_id() == "la");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("Extras are coerced; agentix.sio is forwarded, agentix.utils.log stays",
          "[worker][logs]") {
  auto worker = ReadyWorker();
  worker->Call("x", "worker_fixture::log_extras", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("x").ok);
  LogRecord log = AwaitLog(*worker, "app", "extras");
  std::map<std::string, std::string> extras = Extras(log.extras());
  CHECK(extras["num"] == "2");
  CHECK(extras["text"] == "\"t\"");
  CHECK(extras["seq"] == "[1,[2,\"BIN(size:1)\"]]");
  CHECK(extras["mapping"] == "{\"3\":null}");
  CHECK(extras["obj"] == "\"<class 'object'>\"");
  CHECK(extras.count("_hidden") == 0);
  CHECK(extras.size() == 5);
  AwaitLog(*worker, "agentix.other", "forwarded");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  CHECK(LogsOf(worker->logs(), "agentix.sio.ns").size() == 1);
  CHECK(LogsOf(worker->logs(), "agentix.utils.log").empty());
}

TEST_CASE("print, fd writes and child processes become stdout/stderr logs",
          "[worker][logs]") {
  auto worker = ReadyWorker();
  worker->Call("pr", "worker_fixture::print_lines", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("pr").ok);
  LogRecord log = AwaitLog(*worker, kStdout, "hi");
  // Python-level writes are attributed to the call.
  CHECK(log.call_id() == "pr");
  CHECK(log.origin() == 2);
  CHECK(log.level() == 20);
  CHECK(log.level_name() == "INFO");
  CHECK(log.module() == "stdio");
  CHECK(Extras(log.extras()) ==
        std::map<std::string, std::string>{
            {"agentix_stream", "\"stdout\""},
            {"worker_id", "\"test-worker\""}});
  log = AwaitLog(*worker, kStderr, "to stderr");
  CHECK(log.call_id() == "pr");
  CHECK(log.origin() == 3);
  CHECK(AwaitLog(*worker, kStdout, "partial").call_id() == "pr");

  worker->Call("fd", "worker_fixture::write_fds", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("fd").ok);
  log = AwaitLog(*worker, kStdout, "raw");
  // fd-level output cannot be attributed.
  CHECK(log.call_id().empty());
  CHECK(log.origin() == 2);
  CHECK(absl::StartsWith(log.context(), "sandbox-"));
  CHECK(AwaitLog(*worker, kStderr, "raw err").origin() == 3);
  AwaitLog(*worker, kStdout, "bad \xEF\xBF\xBD utf8");

  worker->Call("ch", "worker_fixture::run_child", Pickle("((), {})"));
  Reply reply = worker->AwaitReply("ch");
  INFO(reply.error.message << reply.error.traceback);
  REQUIRE(reply.ok);
  AwaitLog(*worker, kStdout, "hi");
  CHECK(AwaitLog(*worker, kStderr, "err").call_id().empty());
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("fd output precedes its call's result when results share a write",
          "[worker][logs]") {
  // The barrier (AcquireCaughtUp) runs once per write of queued results:
  // with many calls in flight a pool thread queues several replies before
  // one write, and each call's fd-level line must still come before its
  // result in the stream.
  auto worker = ReadyWorker();
  constexpr int kCalls = 64;
  for (int i = 0; i < kCalls; ++i) {
    worker->Call(absl::StrCat("fd", i), "worker_fixture::fd_line",
                 Pickle(absl::StrCat("((", i, ",), {})")));
  }
  std::set<std::string> lines_seen;
  int replies = 0;
  while (replies < kCalls) {
    REQUIRE_OK_AND_ASSIGN(Frame frame, worker->Next(absl::Seconds(20)));
    REQUIRE(frame.type == FrameType::kResult);
    REQUIRE(absl::StartsWith(frame.call_id, "fd"));
    ++replies;
    for (const LogRecord& log : worker->logs()) {
      if (log.logger() == kStdout) lines_seen.insert(log.message());
    }
    const std::string line = absl::StrCat("fd-line ", frame.call_id.substr(2));
    INFO("result of " << frame.call_id << " after " << lines_seen.size()
                      << " lines");
    CHECK(lines_seen.count(line) == 1);
  }
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("A line over 64 KiB is cut; the rest comes at the end",
          "[worker][logs]") {
  auto worker = ReadyWorker();
  worker->Call("ll", "worker_fixture::long_line",
               Pickle("((70 * 1024,), {})"));
  REQUIRE(worker->AwaitReply("ll").ok);
  AwaitLog(*worker, kStdout, std::string(65536, 'y'));
  // The remainder (no newline) is flushed when the worker shuts down.
  worker->Shutdown();
  AwaitLog(*worker, kStdout, std::string(70 * 1024 - 65536, 'y'));
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("A burst of output does not block the call", "[worker][logs]") {
  auto worker = ReadyWorker();
  const absl::Time start = absl::Now();
  worker->Call("b", "worker_fixture::burst", Pickle("((100000,), {})"));
  Reply reply = worker->AwaitReply("b", absl::Seconds(30));
  INFO(reply.error.message << reply.error.traceback);
  REQUIRE(reply.ok);
  WARN("burst of 3 x 100000 bytes took "
       << absl::FormatDuration(absl::Now() - start));
  auto count = [](const std::vector<LogRecord>& logs, char c) {
    size_t n = 0;
    for (const LogRecord& log : logs) {
      if (log.logger() == kStdout && !log.message().empty() &&
          log.message()[0] == c) {
        n += log.message().size();
      }
    }
    return n;
  };
  REQUIRE(worker->AwaitLogs([&](const std::vector<LogRecord>& logs) {
    return count(logs, 'b') == 99000 && count(logs, 'f') == 99000 &&
           count(logs, 'c') == 100000;
  }));
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("Records keep their order per producer", "[worker][logs]") {
  auto worker = ReadyWorker();
  constexpr int kCount = 300;
  worker->Call("o", "worker_fixture::ordered",
               Pickle(absl::StrCat("((", kCount, ",), {})")));
  REQUIRE(worker->AwaitReply("o").ok);
  REQUIRE(worker->AwaitLogs([&](const std::vector<LogRecord>& logs) {
    return LogsOf(logs, "app.order").size() == kCount &&
           LogsOf(logs, kStdout).size() == 2 * kCount;
  }));
  std::vector<LogRecord> records = LogsOf(worker->logs(), "app.order");
  std::vector<std::string> prints, fds;
  for (const LogRecord& log : LogsOf(worker->logs(), kStdout)) {
    (absl::StartsWith(log.message(), "print") ? prints : fds)
        .push_back(log.message());
  }
  REQUIRE(prints.size() == kCount);
  REQUIRE(fds.size() == kCount);
  for (int i = 0; i < kCount; ++i) {
    CHECK(records[i].message() == absl::StrCat("seq ", i));
    CHECK(records[i].call_id() == "o");
    CHECK(prints[i] == absl::StrCat("print ", i));
    CHECK(fds[i] == absl::StrCat("fd ", i));
  }
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("The durable log file gets records and captured output",
          "[worker][logs]") {
  const std::string dir = absl::StrCat(TempRoot(), "/durable-", getpid());
  fs::remove_all(dir);
  WorkerArgs args;
  args.env.push_back("AGENTIX_LOG_DIR=" + dir + "/nested");
  auto worker = ReadyWorker(args);
  worker->Call("p", "worker_fixture::print_lines", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("p").ok);
  worker->Call("f", "worker_fixture::write_fds", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("f").ok);
  worker->Call("l", "worker_fixture::log_warning", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("l").ok);
  worker->Call("r", "worker_fixture::log_raw_record", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("r").ok);
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  const std::string text = ReadFile(dir + "/nested/sandbox-test-worker.log");
  // A record made without the worker's record factory gets the context.
  CHECK(absl::StrContains(text, "-worker-test-worker] [app.raw] raw record\n"));
  INFO(text);
  CHECK(absl::StrContains(text, "[agentix.sandbox.stdout] hi\n"));
  CHECK(absl::StrContains(text, "[agentix.sandbox.stderr] to stderr\n"));
  CHECK(absl::StrContains(text, "[agentix.sandbox.stdout] raw\n"));
  CHECK(absl::StrContains(text, "[agentix.sandbox.stderr] raw err\n"));
  CHECK(absl::StrContains(text, "-worker-test-worker] [app] x 1\n"));
  // A clean exit cuts the mapped file to its lines.
  CHECK(text.find('\0') == std::string::npos);
  CHECK(text.back() == '\n');
  fs::remove_all(dir);
}

TEST_CASE("A SIGKILLed worker's durable log keeps every record logged "
          "before the kill", "[worker][logs]") {
  // The file is written through a shared mapping: a record copied there is
  // in the page cache, so no flush or close is needed to keep it. What
  // follows the records is NUL bytes up to the size the file had grown to;
  // with AGENTIX_LOG_MAPPED=0 (one write() per line) nothing follows them.
  const bool mapped = GENERATE(true, false);
  INFO("mapped " << mapped);
  const std::string dir = absl::StrCat(TempRoot(), "/killed-", getpid());
  fs::remove_all(dir);
  WorkerArgs args;
  args.env.push_back("AGENTIX_LOG_DIR=" + dir);
  if (!mapped) args.env.push_back("AGENTIX_LOG_MAPPED=0");
  auto worker = ReadyWorker(args);
  constexpr int kRecords = 20000;  // ~2 MiB: the file grows more than once
  worker->Call("k", "worker_fixture::log_then_sigkill",
               Pickle(absl::StrCat("((", kRecords, ",), {})")));
  REQUIRE(worker->AwaitExit(absl::Seconds(60)).returncode() == -SIGKILL);
  const std::string text = ReadFile(dir + "/sandbox-test-worker.log");
  const size_t end = mapped ? text.find('\0') : text.size();
  REQUIRE(end != std::string::npos);
  CHECK(text.find_first_not_of('\0', end) == std::string::npos);
  if (!mapped) CHECK(text.find('\0') == std::string::npos);
  std::istringstream lines(text.substr(0, end));
  std::string line;
  int next = 0;
  while (std::getline(lines, line)) {
    if (!absl::StrContains(line, "[app.killed] record ")) continue;
    CHECK(absl::StrContains(
        line, absl::StrCat("[app.killed] record ", next, " before the kill")));
    ++next;
  }
  CHECK(next == kRecords);
  CHECK(text[end - 1] == '\n');
  fs::remove_all(dir);
}

TEST_CASE("The durable log writes what logging.Formatter would",
          "[worker][logs]") {
  // Its default format skips Formatter's generic steps; records with an
  // exception, a stack, a non-str message or context must come out the same.
  const std::string dir = absl::StrCat(TempRoot(), "/format-", getpid());
  fs::remove_all(dir);
  WorkerArgs args;
  args.env.push_back("AGENTIX_LOG_DIR=" + dir);
  auto worker = ReadyWorker(args);
  worker->Call("f", "worker_fixture::durable_format_matches_formatter",
               Pickle("((), {})"));
  const Reply reply = worker->AwaitReply("f");
  INFO(reply.error.message);
  CHECK(reply.ok);
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  fs::remove_all(dir);
}

TEST_CASE("The durable log's C line is logging.Formatter's line",
          "[worker][logs]") {
  // write_log_line, which the durable handler uses for plain records in the
  // default format, against logging.Formatter; what it declines (exception
  // or stack text, text that does not encode, odd values) is not written.
  const std::string dir = absl::StrCat(TempRoot(), "/line-", getpid());
  fs::remove_all(dir);
  WorkerArgs args;
  args.env.push_back("AGENTIX_LOG_DIR=" + dir);
  auto worker = ReadyWorker(args);
  worker->Call("f", "worker_fixture::durable_line_matches_formatter",
               Pickle("((), {})"));
  const Reply reply = worker->AwaitReply("f");
  INFO(reply.error.message);
  CHECK(reply.ok);
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  fs::remove_all(dir);
}

TEST_CASE("The worker's record factory makes the records LogRecord makes",
          "[worker][logs]") {
  // logging.LogRecord's records are built in C (record_factory.h): the same
  // attributes in the same order and the same values, for mappings as args,
  // levels without a name, odd paths, other threads, a renamed process,
  // logging's switches off, keyword calls, forked children, a replaced
  // time.time and a replaced threading.get_ident.
  auto worker = ReadyWorker();
  worker->Call("f", "worker_fixture::record_factory_matches_stdlib",
               Pickle("((), {})"));
  const Reply reply = worker->AwaitReply("f");
  INFO(reply.error.message);
  REQUIRE(reply.ok);
  CHECK(Unpickle(reply.value) == "21");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("The worker's C Logger._log sends the records the stdlib's sends",
          "[worker][logs]") {
  // worker_fixture::logger_log_in_c makes each call through the C _log
  // (logger_log.h) and then the stdlib's, from one line: the two frames
  // must be the same but for the time (caller, extras, adapter, stacklevel).
  auto worker = ReadyWorker();
  CHECK(Unpickle(worker->CallOk("worker_fixture::logger_log_in_c",
                                Pickle("((), {})"))) == "4");
  AwaitLog(*worker, "app.clog", "clog 3");
  const std::vector<LogRecord> logs = LogsOf(worker->logs(), "app.clog");
  REQUIRE(logs.size() == 8);
  for (size_t i = 0; i < logs.size(); i += 2) {
    LogRecord c = logs[i];
    LogRecord stdlib = logs[i + 1];
    INFO(c.DebugString());
    CHECK(c.time_unix_nanos() > 0);
    c.clear_time_unix_nanos();
    stdlib.clear_time_unix_nanos();
    CHECK(c.DebugString() == stdlib.DebugString());
  }
  CHECK(logs[0].message() == "clog 0 \xc3\xa9");
  CHECK(logs[0].function() == "<lambda>");
  CHECK(logs[2].function() == "logger_log_in_c");  // stacklevel=2
  CHECK(logs[4].extras().size() > 0);
  CHECK(logs[6].level_name() == "ERROR");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("The worker's C Logger methods leave audited logging to the stdlib",
          "[worker][logs]") {
  // Once user code adds an audit hook, the hook sees (and may refuse) the
  // stdlib's "sys._getframe" from findCaller for every record, and the C
  // methods, which have no such frame, leave each call to the stdlib's.
  auto worker = ReadyWorker();
  CHECK(Unpickle(worker->CallOk("worker_fixture::logger_log_audited",
                                Pickle("((), {})"))) == "3");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("The bridge's C path and its general path send the same record",
          "[worker][logs]") {
  // Each record goes through _LogBridge.handle (send_log_record) and then
  // _LogBridge.emit (send_log): a field one path sends and the other does
  // not would show here.
  auto worker = ReadyWorker();
  CHECK(Unpickle(worker->CallOk("worker_fixture::bridge_paths_agree",
                                Pickle("((), {})"))) == "3");
  for (const std::string message :
       {"agree 0 \xc3\xa9", "agree 1", "agree 2"}) {
    AwaitLog(*worker, "app.agree", message);
    std::vector<LogRecord> pair;
    for (const LogRecord& log : LogsOf(worker->logs(), "app.agree")) {
      if (log.message() == message) pair.push_back(log);
    }
    INFO(message);
    REQUIRE(pair.size() == 2);
    CHECK(pair[0].DebugString() == pair[1].DebugString());
    CHECK(pair[0].call_id() == pair[1].call_id());
  }
  const std::vector<LogRecord> logs = LogsOf(worker->logs(), "app.agree");
  CHECK(logs[2].stack_info() == "Stack (most recent call last):");
  CHECK(logs[4].exception_text() == "Traceback: formatted before");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("The log handlers' C handle does what their Python handle does",
          "[worker][logs]") {
  // worker_fixture::log_handles_in_c sends each record through the C handle
  // (log_handles.h) and then the class's Python handle: both frames and both
  // durable lines must be the same. A handler filter still runs (nothing of
  // "filtered out"), and the fixture checks the lock and the size count.
  const std::string dir = absl::StrCat(TempRoot(), "/handles-", getpid());
  fs::remove_all(dir);
  WorkerArgs args;
  args.env.push_back("AGENTIX_LOG_DIR=" + dir);
  auto worker = ReadyWorker(args);
  worker->Call("h", "worker_fixture::log_handles_in_c", Pickle("((), {})"));
  const Reply reply = worker->AwaitReply("h");
  INFO(reply.error.message);
  REQUIRE(reply.ok);
  AwaitLog(*worker, "app.handles", "handles nested arg");
  const std::vector<LogRecord> logs = LogsOf(worker->logs(), "app.handles");
  const std::vector<std::string> messages = {"handles 0 \xc3\xa9", "handles 1 7",
                                             "handles 2"};
  for (const std::string& message : messages) {
    std::vector<LogRecord> pair;
    for (const LogRecord& log : logs) {
      if (log.message() == message) pair.push_back(log);
    }
    INFO(message);
    REQUIRE(pair.size() == 2);
    CHECK(pair[0].DebugString() == pair[1].DebugString());
  }
  CHECK(LogsOf(worker->logs(), "app.nested").size() == 2);
  std::vector<std::string> sent;
  for (const LogRecord& log : logs) sent.push_back(log.message());
  CHECK(sent == std::vector<std::string>{
                    messages[0], messages[0], messages[1], messages[1],
                    messages[2], messages[2], "handles after the filter",
                    "handles nested arg"});
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  CHECK(Unpickle(reply.value, "v") == dir + "/sandbox-test-worker.log");
  std::istringstream file(ReadFile(dir + "/sandbox-test-worker.log"));
  std::map<std::string, std::vector<std::string>> lines;  // message -> lines
  std::string line;
  int count = 0;
  while (std::getline(file, line)) {
    const size_t at = line.find("[app.handles] ");
    if (at == std::string::npos) continue;
    lines[line.substr(at + 14)].push_back(line);
    ++count;
  }
  for (const std::string& message : messages) {
    INFO(message);
    REQUIRE(lines[message].size() == 2);
    CHECK(lines[message][0] == lines[message][1]);
  }
  CHECK(lines["handles after the filter"].size() == 1);
  CHECK(lines["handles nested arg"].size() == 1);
  CHECK(count == 8);
  fs::remove_all(dir);
}

TEST_CASE("The durable log rotates by bytes, keeping whole lines",
          "[worker][logs]") {
  const std::string dir = absl::StrCat(TempRoot(), "/rotate-", getpid());
  fs::remove_all(dir);
  WorkerArgs args;
  args.env.push_back("AGENTIX_LOG_DIR=" + dir);
  auto worker = ReadyWorker(args);
  constexpr int kRecords = 300;
  constexpr int kMaxBytes = 8192;
  worker->Call("r", "worker_fixture::durable_rotation",
               Pickle(absl::StrCat("((", kRecords, ", ", kMaxBytes, "), {})")));
  REQUIRE(worker->AwaitReply("r").ok);
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  const std::string path = dir + "/sandbox-test-worker.log";
  const std::string backup = ReadFile(path + ".1");
  const std::string current = ReadFile(path);
  // Each file stays under the limit in bytes (the records hold two-byte
  // characters), and together they end with the last records, in order.
  CHECK(backup.size() < kMaxBytes);
  CHECK(current.size() < kMaxBytes);
  const std::regex line(
      R"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \[[^\]]*-worker-test-worker\] )"
      R"(\[app\.rotate\] rotate (\d{4}) (\xC3\xA9){40})");
  int expected = -1;
  for (const std::string* text : {&backup, &current}) {
    std::istringstream lines(*text);
    std::string one;
    while (std::getline(lines, one)) {
      std::smatch match;
      if (!std::regex_match(one, match, line)) continue;  // earlier records
      const int index = std::stoi(match[1]);
      if (expected >= 0) CHECK(index == expected);
      expected = index + 1;
    }
    CHECK(text->back() == '\n');
  }
  CHECK(expected == kRecords);
  fs::remove_all(dir);
}

TEST_CASE("AGENTIX_LOG_DIR=\"\" disables the durable log", "[worker][logs]") {
  const std::string id = absl::StrCat("nolog-", getpid());
  WorkerArgs args;
  args.args.push_back("--worker-id=" + id);
  args.env.push_back("AGENTIX_LOG_DIR=");
  auto worker = ReadyWorker(args);
  worker->Call("p", "worker_fixture::print_lines", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("p").ok);
  AwaitLog(*worker, kStdout, "hi");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  // Empty is not unset: the default directory is not used either.
  CHECK_FALSE(fs::exists("/tmp/agentix/sandbox-" + id + ".log"));
  CHECK_FALSE(fs::exists("sandbox-" + id + ".log"));
  // No record says the file was detached: it was never wanted.
  for (const LogRecord& log : worker->logs()) {
    CHECK_FALSE(absl::StrContains(log.message(), "durable sandbox log"));
  }
}

TEST_CASE("An unusable log dir detaches the durable log with one record",
          "[worker][logs]") {
  const std::string file = absl::StrCat(TempRoot(), "/not-a-dir-", getpid());
  WriteFile(file, "x");
  WorkerArgs args;
  args.env.push_back("AGENTIX_LOG_DIR=" + file);
  auto worker = ReadyWorker(args);
  REQUIRE(worker->AwaitLogs([](const std::vector<LogRecord>& logs) {
    for (const LogRecord& l : logs) {
      if (l.logger() == kStderr &&
          absl::StartsWith(l.message(), "agentix: durable sandbox log detached")) {
        return true;
      }
    }
    return false;
  }));
  // Calls work as usual.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::add",
                                  Pickle("((1, 2), {})"))) == "3");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  fs::remove(file);
}

// Mode bits of `path` (lstat).
mode_t ModeOf(const std::string& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

// Starts a worker with AGENTIX_LOG_DIR=`dir`, waits for the one record that
// says the durable log was refused, and checks that calls still work.
void ExpectLogRefused(const std::string& dir, const std::string& reason) {
  WorkerArgs args;
  args.env.push_back("AGENTIX_LOG_DIR=" + dir);
  auto worker = ReadyWorker(args);
  std::string said;
  REQUIRE(worker->AwaitLogs([&](const std::vector<LogRecord>& logs) {
    for (const LogRecord& l : logs) {
      if (l.logger() == kStderr &&
          absl::StartsWith(l.message(),
                           "agentix: durable sandbox log detached: refusing")) {
        said = l.message();
        return true;
      }
    }
    return false;
  }));
  INFO(said);
  CHECK(absl::StrContains(said, reason));
  CHECK(absl::StrContains(said, "AGENTIX_LOG_DIR"));
  worker->Call("p", "worker_fixture::print_lines", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("p").ok);
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::add",
                                  Pickle("((1, 2), {})"))) == "3");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
}

TEST_CASE("A fresh durable log dir is 0700 and the log file 0600",
          "[worker][logs]") {
  const std::string dir = absl::StrCat(TempRoot(), "/private-", getpid());
  fs::remove_all(dir);
  const mode_t old_umask = ::umask(0);  // the modes must not rely on a umask
  WorkerArgs args;
  args.env.push_back("AGENTIX_LOG_DIR=" + dir);
  auto worker = ReadyWorker(args);
  ::umask(old_umask);
  worker->Call("p", "worker_fixture::print_lines", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("p").ok);
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  CHECK(ModeOf(dir) == 0700);
  CHECK(ModeOf(dir + "/sandbox-test-worker.log") == 0600);
  fs::remove_all(dir);
}

TEST_CASE("A durable log dir others can write to is refused",
          "[worker][logs]") {
  const std::string dir = absl::StrCat(TempRoot(), "/open-", getpid());
  fs::remove_all(dir);
  fs::create_directory(dir);
  REQUIRE(::chmod(dir.c_str(), 01777) == 0);  // like /tmp
  ExpectLogRefused(dir, "is writable by group or others (mode 1777)");
  CHECK_FALSE(fs::exists(dir + "/sandbox-test-worker.log"));
  fs::remove_all(dir);
}

TEST_CASE("A durable log dir owned by another uid is refused",
          "[worker][logs]") {
  const std::string dir = absl::StrCat(TempRoot(), "/theirs-", getpid());
  fs::remove_all(dir);
  fs::create_directory(dir);
  // Pre-created by someone else (the test runs as root, which can chown).
  REQUIRE(::chown(dir.c_str(), 65534, 65534) == 0);
  REQUIRE(::chmod(dir.c_str(), 0700) == 0);
  ExpectLogRefused(dir, "is owned by uid 65534");
  CHECK_FALSE(fs::exists(dir + "/sandbox-test-worker.log"));
  fs::remove_all(dir);
}

TEST_CASE("A symlink as the durable log dir is refused", "[worker][logs]") {
  const std::string target = absl::StrCat(TempRoot(), "/target-", getpid());
  const std::string link = absl::StrCat(TempRoot(), "/link-", getpid());
  fs::remove_all(target);
  fs::remove(link);
  fs::create_directory(target);
  REQUIRE(::chmod(target.c_str(), 0700) == 0);
  fs::create_directory_symlink(target, link);
  ExpectLogRefused(link, "is a symlink");
  CHECK(fs::is_empty(target));
  fs::remove(link);
  fs::remove_all(target);
}

TEST_CASE("A planted log file (symlink, hard link, another uid's) is refused",
          "[worker][logs]") {
  const std::string dir = absl::StrCat(TempRoot(), "/planted-", getpid());
  const std::string log = dir + "/sandbox-test-worker.log";
  const std::string victim = dir + "/victim";
  fs::remove_all(dir);
  fs::create_directory(dir);
  REQUIRE(::chmod(dir.c_str(), 0700) == 0);
  WriteFile(victim, "");
  SECTION("symlink") {
    fs::create_symlink(victim, log);
    ExpectLogRefused(dir, "is a symlink");
  }
  SECTION("hard link") {
    fs::create_hard_link(victim, log);
    ExpectLogRefused(dir, "has 2 hard links");
  }
  SECTION("another uid's file") {
    WriteFile(log, "");
    REQUIRE(::chown(log.c_str(), 65534, 65534) == 0);
    ExpectLogRefused(dir, "is owned by uid 65534");
    CHECK(ReadFile(log).empty());
  }
  CHECK(ReadFile(victim).empty());
  fs::remove_all(dir);
}

TEST_CASE("A forked child's output is captured; its records are dropped",
          "[worker][logs]") {
  auto worker = ReadyWorker();
  worker->Call("fk", "worker_fixture::fork_child", Pickle("((), {})"));
  REQUIRE(worker->AwaitReply("fk").ok);
  CHECK(AwaitLog(*worker, kStdout, "printed in a forked child").call_id().empty());
  CHECK(AwaitLog(*worker, "app", "parent after fork").call_id() == "fk");
  worker->Shutdown();
  REQUIRE(worker->AwaitExit().returncode() == 0);
  CHECK(LogsOf(worker->logs(), "app.child").empty());
}

}  // namespace
}  // namespace agentix::worker
