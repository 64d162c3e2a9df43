// agentix-worker end to end: calls, their errors, concurrency, cancellation,
// chunked arguments and results, encodings.
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

TEST_CASE("The worker reports ready with its Python version", "[worker]") {
  Worker worker;
  REQUIRE_OK_AND_ASSIGN(Frame ready, worker.Next(absl::Seconds(20)));
  REQUIRE(ready.type == FrameType::kReady);
  REQUIRE(ready.pid == worker.pid());
  REQUIRE(ready.detail == "3.11.2");
  worker.Shutdown();
  REQUIRE(worker.AwaitExit().returncode() == 0);
}

TEST_CASE("Builtins run and return protocol-5 pickles", "[worker]") {
  auto worker = ReadyWorker();
  std::string value = worker->CallOk("math::factorial", Pickle("((10,), {})"));
  REQUIRE(value == Pickle("3628800"));
  REQUIRE(Unpickle(value) == "3628800");
  value = worker->CallOk("builtins::len", Pickle("(([1, 2, 3],), {})"));
  REQUIRE(value == std::string("\x80\x05K\x03.", 5));
  value = worker->CallOk("asyncio::sleep", Pickle("((0, 'slept'), {})"));
  REQUIRE(Unpickle(value) == "'slept'");
}

TEST_CASE("Fixture targets: sync, async, static, stateful", "[worker]") {
  auto worker = ReadyWorker();
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::add",
                                  Pickle("((2,), {'b': 3})"))) == "5");
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::async_add",
                                  Pickle("((2, 40), {})"))) == "42");
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::Echo.echo",
                                  Pickle("(('hi',), {})"))) == "'hi'");
  REQUIRE(Unpickle(worker->CallOk(
              "worker_fixture::Echo.method",
              Pickle("((__import__('types').SimpleNamespace(), 7), {})"))) ==
          "('method', 7)");
  // A sync function returning a coroutine: the coroutine is awaited.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::returns_coroutine",
                                  Pickle("((), {})"))) == "3");
  // Module state persists between calls.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::count",
                                  Pickle("((), {})"))) == "1");
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::count",
                                  Pickle("((), {})"))) == "2");
  // Sync targets run on named pool threads (Python and OS names).
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::thread_name",
                                  Pickle("((), {})")),
                   "v[0].startswith('agentix-call_') and v[1]") ==
          "agentix-call");
  // User output on fd 1/2 does not disturb the channel.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::noisy",
                                  Pickle("((), {})"))) == "'ok'");
}

TEST_CASE("The interpreter is Debian's, isolated from the environment",
          "[worker]") {
  auto worker = ReadyWorker();
  const std::string info =
      worker->CallOk("worker_fixture::interpreter_info", Pickle("((), {})"));
  REQUIRE(Unpickle(info, "v['executable']") == "/usr/bin/python3");
  REQUIRE(Unpickle(info, "v['prefix']") == "/usr");
  REQUIRE(Unpickle(info, "v['version']") == "3.11.2");
  REQUIRE(Unpickle(info, "v['isolated']") == "1");
  REQUIRE(Unpickle(info, "v['os_file']") == "/usr/lib/python3.11/os.py");
  REQUIRE(Unpickle(info, "v['argv']") == "['agentix-worker']");
  // PYTHONPATH / PYTHONHOME in the environment were ignored; the import
  // roots come first, then the stdlib, then Debian's dist-packages.
  const std::string path =
      worker->CallOk("worker_fixture::sys_path", Pickle("((), {})"));
  REQUIRE(Unpickle(path) == ExpectedSysPath());
  REQUIRE(Unpickle(path, "v[:3]") ==
          absl::StrCat("['", FixtureDir(),
                       "', '/usr/lib/python3.11', "
                       "'/usr/lib/python3.11/lib-dynload']"));
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::env",
                                  Pickle("(('AGENTIX_WORKER_ID',), {})"))) ==
          "'test-worker'");
}

// The binary links libpython statically unless built with
// --define=agentix_libpython=shared (worker/BUILD.bazel); extension modules
// (lib-dynload's, Debian's numpy) bind to the interpreter in the binary.
TEST_CASE("Extension modules load and use the worker's one libpython",
          "[worker]") {
  auto worker = ReadyWorker();
  const std::string used =
      worker->CallOk("worker_fixture::extension_modules", Pickle("((), {})"));
  REQUIRE(Unpickle(used, "v['pythonapi']") == "42");
  REQUIRE(Unpickle(used, "v['decimal']") == "3.305");
  REQUIRE(Unpickle(used, "v['ssl']") == "True");
  REQUIRE(Unpickle(used, "v['asyncio']") == "slept");
  REQUIRE(Unpickle(used, "v['numpy']") == "45");
#ifdef AGENTIX_WORKER_LIBPYTHON_SHARED
  REQUIRE(Unpickle(used, "len(v['libpython_mapped'])") == "1");
#else
  REQUIRE(Unpickle(used, "v['libpython_mapped']") == "[]");
#endif
}

TEST_CASE("A target rebound in its module is the one called", "[worker]") {
  auto worker = ReadyWorker();
  const std::string none = Pickle("((), {})");
  // Twice first: the second resolution may come from what the first found.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::swappable", none)) ==
          "'first'");
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::swappable", none)) ==
          "'first'");
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::swap_target", none)) ==
          "True");
  // Now a coroutine function: awaited on the loop, its value returned.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::swappable", none)) ==
          "'second'");
}

TEST_CASE("Resolve failures are typed errors with code 3", "[worker]") {
  auto worker = ReadyWorker();
  const std::string no_args = Pickle("((), {})");

  ipc::ErrorInfo e = worker->CallError("no_such_module_xyz::f", no_args);
  REQUIRE(e.type == "ModuleNotFoundError");
  REQUIRE(e.code == 3);
  REQUIRE(e.message == "No module named 'no_such_module_xyz'");
  REQUIRE_FALSE(e.cancelled);

  e = worker->CallError("worker_fixture::missing", no_args);
  REQUIRE(e.type == "AttributeError");
  REQUIRE(e.code == 3);

  e = worker->CallError("worker_fixture::Echo.missing", no_args);
  REQUIRE(e.type == "AttributeError");

  e = worker->CallError("worker_fixture::NOT_CALLABLE", no_args);
  REQUIRE(e.type == "TypeError");
  REQUIRE(e.code == 3);
  REQUIRE(e.message.find("not callable") != std::string::npos);

  e = worker->CallError("worker_fixture.add", no_args);
  REQUIRE(e.type == "ValueError");
  REQUIRE(e.code == 3);
  REQUIRE(e.message.rfind("invalid remote callable reference", 0) == 0);

  e = worker->CallError("worker_broken::f", no_args);
  REQUIRE(e.type == "RuntimeError");
  REQUIRE(e.message == "worker_broken refuses to import");
  REQUIRE(e.traceback.find("worker_broken.py") != std::string::npos);
}

TEST_CASE("Undecodable arguments are ArgumentsDecodeError", "[worker]") {
  auto worker = ReadyWorker();
  ipc::ErrorInfo e = worker->CallError("worker_fixture::add", "not a pickle");
  REQUIRE(e.type == "ArgumentsDecodeError");
  REQUIRE(e.code == 3);
  REQUIRE(e.message.rfind("failed to decode arguments: ", 0) == 0);
  REQUIRE_FALSE(e.traceback.empty());

  e = worker->CallError("worker_fixture::add", Pickle("5"));
  REQUIRE(e.type == "ArgumentsDecodeError");
  REQUIRE(e.message == "arguments must be an (args, kwargs) pair, got int");

  // A pickle naming a module that does not exist (STACK_GLOBAL no_such_mod.f).
  constexpr char kMissingGlobal[] =
      "\x80\x04\x8c\x0bno_such_mod\x94\x8c\x01" "f\x94\x93\x94.";
  e = worker->CallError("worker_fixture::add",
                        std::string(kMissingGlobal, sizeof(kMissingGlobal) - 1));
  REQUIRE(e.type == "ArgumentsDecodeError");
  REQUIRE(e.message.find("ModuleNotFoundError") != std::string::npos);
}

TEST_CASE("User exceptions, BaseExceptions included, become error frames",
          "[worker]") {
  auto worker = ReadyWorker();
  ipc::ErrorInfo e =
      worker->CallError("worker_fixture::fail", Pickle("(('boom',), {})"));
  REQUIRE(e.type == "ValueError");
  REQUIRE(e.message == "boom");
  REQUIRE(e.code == 2);
  REQUIRE(e.traceback.find("worker_fixture.py") != std::string::npos);
  REQUIRE(e.traceback.find("in fail") != std::string::npos);
  REQUIRE(e.traceback.find("ValueError: boom") != std::string::npos);
  // The driver's own wrapper frame is trimmed.
  REQUIRE(e.traceback.find("<agentix-worker driver") == std::string::npos);

  e = worker->CallError("math::factorial", Pickle("((-1,), {})"));
  REQUIRE(e.type == "ValueError");
  REQUIRE(e.traceback == "ValueError: factorial() not defined for negative "
                         "values\n");

  e = worker->CallError("worker_fixture::exit_now", Pickle("((3,), {})"));
  REQUIRE(e.type == "SystemExit");
  REQUIRE(e.message == "3");
  REQUIRE(e.code == 2);

  e = worker->CallError("worker_fixture::interrupt", Pickle("((), {})"));
  REQUIRE(e.type == "KeyboardInterrupt");
  REQUIRE(e.message == "stop");

  e = worker->CallError("worker_fixture::add", Pickle("((), {'c': 1})"));
  REQUIRE(e.type == "TypeError");
  REQUIRE(e.code == 2);

  // The worker keeps serving.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::add",
                                  Pickle("((1, 2), {})"))) == "3");
}

TEST_CASE("Unpicklable results are ResultEncodeError", "[worker]") {
  auto worker = ReadyWorker();
  ipc::ErrorInfo e =
      worker->CallError("worker_fixture::unpicklable", Pickle("((), {})"));
  REQUIRE(e.type == "ResultEncodeError");
  REQUIRE(e.code == 3);
  REQUIRE(e.message.rfind("failed to pickle return value: ", 0) == 0);
}

TEST_CASE("Coroutines run concurrently on the loop", "[worker][timing]") {
  auto worker = ReadyWorker();
  const std::string args = Pickle("((0.2,), {})");
  std::set<std::string> ids;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 10; ++i) {
    ids.insert(absl::StrCat("s", i));
    worker->Call(absl::StrCat("s", i), "worker_fixture::sleep_async", args);
  }
  auto replies = worker->AwaitReplies(ids, absl::Seconds(10));
  const absl::Duration took = absl::Now() - start;
  INFO("10 x 0.2 s took " << absl::FormatDuration(took));
  // Serially this would take 2 s; concurrently ~0.2 s plus start-up noise.
  REQUIRE(took < absl::Milliseconds(1200));
  for (auto& [id, reply] : replies) REQUIRE(reply.ok);
}

TEST_CASE("Sync calls run in parallel on the pool", "[worker][timing]") {
  auto worker = ReadyWorker();
  const std::string args = Pickle("((0.3,), {})");
  std::set<std::string> ids;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 8; ++i) {
    ids.insert(absl::StrCat("b", i));
    worker->Call(absl::StrCat("b", i), "worker_fixture::sleep_sync", args);
  }
  worker->AwaitReplies(ids, absl::Seconds(10));
  const absl::Duration took = absl::Now() - start;
  INFO("8 x 0.3 s blocking took " << absl::FormatDuration(took));
  REQUIRE(took < absl::Milliseconds(1600));  // serially: 2.4 s
}

TEST_CASE("A blocking sync call does not stall async calls",
          "[worker][timing]") {
  auto worker = ReadyWorker();
  // A warm worker (event loop started, the fixture imported): what a cold
  // one adds is worker_lifecycle_test's.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::async_add",
                                  Pickle("((1, 1), {})"))) == "2");
  worker->Call("blocking", "worker_fixture::sleep_sync", Pickle("((2.0,), {})"));
  const absl::Time start = absl::Now();
  worker->Call("quick", "worker_fixture::async_add", Pickle("((1, 1), {})"));
  REQUIRE_OK_AND_ASSIGN(Frame first, worker->Next(absl::Seconds(5)));
  REQUIRE(first.call_id == "quick");
  REQUIRE(first.type == FrameType::kResult);
  REQUIRE(absl::Now() - start < absl::Seconds(1));
  Reply blocking = worker->AwaitReply("blocking");
  REQUIRE(blocking.ok);
}

TEST_CASE("Cancelling a coroutine answers Cancelled and stops the task",
          "[worker]") {
  auto worker = ReadyWorker();
  const std::string marker = absl::StrCat(TempRoot(), "/cancel_marker_",
                                          getpid());
  fs::remove(marker);
  worker->Call("c1", "worker_fixture::cancellable",
               Pickle(absl::StrCat("(('", marker, "',), {})")));
  worker->ExpectSilence(absl::Milliseconds(200));
  worker->Cancel("c1");
  Reply reply = worker->AwaitReply("c1", absl::Seconds(5));
  REQUIRE_FALSE(reply.ok);
  REQUIRE(reply.error.type == "Cancelled");
  REQUIRE(reply.error.message == "remote call cancelled");
  REQUIRE(reply.error.code == 1);
  REQUIRE(reply.error.cancelled);
  // The coroutine really got CancelledError.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::exists",
                                  Pickle(absl::StrCat("(('", marker,
                                                      "',), {})")))) == "True");
  // Nothing more for c1; cancelling again or an unknown id is a no-op.
  worker->Cancel("c1");
  worker->Cancel("never-started");
  worker->ExpectSilence(absl::Milliseconds(300));
}

TEST_CASE("Cancelling a sync call drops its late result", "[worker]") {
  auto worker = ReadyWorker();
  worker->Call("s1", "worker_fixture::sleep_sync", Pickle("((0.5,), {})"));
  worker->ExpectSilence(absl::Milliseconds(100));
  worker->Cancel("s1");
  Reply reply = worker->AwaitReply("s1", absl::Seconds(5));
  REQUIRE(reply.error.type == "Cancelled");
  REQUIRE(reply.error.cancelled);
  worker->ExpectSilence(absl::Milliseconds(1000));
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::add",
                                  Pickle("((1, 2), {})"))) == "3");
}

TEST_CASE("A sync call cancelled while waiting for a pool thread never runs",
          "[worker]") {
  auto worker = ReadyWorker();
  const std::string marker =
      absl::StrCat(TempRoot(), "/pool_marker_", getpid());
  const std::string touch_args = Pickle(absl::StrCat("(('", marker, "',), {})"));
  const std::string second = Pickle("((1.0,), {})");
  const std::string half = Pickle("((0.5,), {})");
  // Every one of the pool's 64 threads busy for a second.
  std::set<std::string> ids;
  for (int i = 0; i < 64; ++i) {
    ids.insert(absl::StrCat("busy", i));
    worker->Call(absl::StrCat("busy", i), "worker_fixture::sleep_sync", second);
  }
  fs::remove(marker);
  worker->Call("queued", "worker_fixture::touch", touch_args);
  worker->Cancel("queued");
  ids.insert("queued");
  // (Starting 64 threads takes a while, so the replies come in any order.)
  auto replies = worker->AwaitReplies(ids, absl::Seconds(30));
  REQUIRE(replies["queued"].error.type == "Cancelled");
  for (int i = 0; i < 64; ++i) REQUIRE(replies[absl::StrCat("busy", i)].ok);
  // The freed threads took nothing left over: the cancelled call never ran.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::exists", touch_args)) ==
          "False");
  // One queued behind busy threads and not cancelled runs once one is free.
  ids.erase("queued");
  for (const std::string& id : ids) {
    worker->Call(id, "worker_fixture::sleep_sync", half);
  }
  worker->Call("later", "worker_fixture::touch", touch_args);
  ids.insert("later");
  REQUIRE(worker->AwaitReplies(ids, absl::Seconds(30))["later"].ok);
  REQUIRE(fs::exists(marker));
  fs::remove(marker);
}

TEST_CASE("A finished sync call lets go of its arguments at once",
          "[worker]") {
  auto worker = ReadyWorker();
  // Without the cycle collector, only reference counting frees them: a
  // call's arguments must not wait for it (a big one would keep its pages).
  worker->CallOk("worker_fixture::disable_gc", Pickle("((), {})"));
  worker->CallOk("worker_fixture::echo", Pickle("((b'x' * 100000,), {})"));
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::pool_jobs_holding_arguments",
                                  Pickle("((), {})"))) == "0");
}

TEST_CASE("A sync call's arguments do not wait for the next call",
          "[worker]") {
  auto worker = ReadyWorker();
  // Sync calls one at a time: the pool thread reading the channel runs them
  // itself, then waits for the next frames; it must not keep the last
  // call's arguments meanwhile.
  for (int i = 0; i < 3; ++i) {
    worker->CallOk("worker_fixture::add", Pickle("((1, 2), {})"));
  }
  worker->CallOk("worker_fixture::watch_holders",
                 Pickle("(([1, 2, 3], 1.0), {})"));
  absl::SleepFor(absl::Seconds(1.5));  // the watch is over, no frame came
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::watched_holders",
                                  Pickle("((), {})"))) == "0");
}

TEST_CASE("Cancelling while arguments arrive", "[worker]") {
  auto worker = ReadyWorker();
  const std::string args = Pickle("((b'z' * 3000000,), {})");
  Frame call;
  call.type = FrameType::kCall;
  call.call_id = "partial";
  call.callable = "worker_fixture::length";
  call.encoding = 1;
  call.total_size = args.size();
  call.data = args.substr(0, ipc::kChunkBytes);
  worker->Send(call);
  worker->Cancel("partial");
  Reply reply = worker->AwaitReply("partial", absl::Seconds(5));
  REQUIRE(reply.error.type == "Cancelled");
  Frame chunk;
  chunk.type = FrameType::kArgChunk;
  chunk.call_id = "partial";
  chunk.data = args.substr(ipc::kChunkBytes);
  worker->Send(chunk);
  worker->ExpectSilence(absl::Milliseconds(300));
}

TEST_CASE("Over-long chunked arguments are ArgumentsDecodeError", "[worker]") {
  auto worker = ReadyWorker();
  const std::string args = Pickle("((b'z' * 1500000,), {})");
  Frame call;
  call.type = FrameType::kCall;
  call.call_id = "long";
  call.callable = "worker_fixture::length";
  call.encoding = 1;
  call.total_size = args.size() - 10;
  call.data = args.substr(0, ipc::kChunkBytes);
  worker->Send(call);
  Frame chunk;
  chunk.type = FrameType::kArgChunk;
  chunk.call_id = "long";
  chunk.data = args.substr(ipc::kChunkBytes);
  worker->Send(chunk);
  Reply reply = worker->AwaitReply("long", absl::Seconds(5));
  REQUIRE(reply.error.type == "ArgumentsDecodeError");
  REQUIRE(reply.error.code == 3);
  REQUIRE(reply.error.message ==
          absl::StrCat("received ", args.size(), " argument bytes, but "
                       "total_size is ", args.size() - 10));
  // The call is over: its later chunks are dropped.
  worker->Send(chunk);
  worker->ExpectSilence(absl::Milliseconds(300));
}

TEST_CASE("Large arguments and results travel in chunks", "[worker]") {
  auto worker = ReadyWorker();
  // 3 MiB of arguments: a call frame plus arg_chunk frames.
  std::string value = worker->CallOk("worker_fixture::length",
                                     Pickle("((b'y' * 3145728,), {})"));
  REQUIRE(Unpickle(value) == "3145728");

  // A 20 MiB result: result_chunks + the final result with total_size.
  worker->Call("big", "worker_fixture::big", Pickle("((20 * 1024 * 1024,), {})"));
  Reply reply = worker->AwaitReply("big", absl::Seconds(60));
  REQUIRE(reply.ok);
  REQUIRE(reply.chunks == 20);
  REQUIRE(reply.total_size == reply.value.size());
  REQUIRE(reply.total_size > 20u * 1024 * 1024);
  REQUIRE(Unpickle(reply.value, "len(v) == 20 * 1024 * 1024 and v == b'x' * len(v)") ==
          "True");
}

TEST_CASE("Encoding 2 (msgpack) in and out", "[worker]") {
  auto worker = ReadyWorker();
  std::string args = Msgpack([](auto& p) {
    p.pack_array(2);
    p.pack_array(2);
    p.pack(2);
    p.pack(3);
    p.pack_map(0);
  });
  std::string value = worker->CallOk("worker_fixture::add", args, 2);
  msgpack::object_handle result = msgpack::unpack(value.data(), value.size());
  REQUIRE(result.get().as<int>() == 5);

  args = Msgpack([](auto& p) {
    p.pack_array(2);
    p.pack_array(1);
    p.pack_array(4);
    p.pack(std::string("text"));
    p.pack(1.5);
    p.pack_nil();
    p.pack_bin(2);
    p.pack_bin_body("\x00\x01", 2);
    p.pack_map(0);
  });
  value = worker->CallOk("worker_fixture::echo", args, 2);
  // The echoed list is the arguments' inner array, byte for byte.
  REQUIRE(value.size() == args.size() - 3);
  REQUIRE(value == args.substr(2, value.size()));

  ipc::ErrorInfo e =
      worker->CallError("worker_fixture::unencodable_for_msgpack",
                        Msgpack([](auto& p) {
                          p.pack_array(2);
                          p.pack_array(0);
                          p.pack_map(0);
                        }),
                        2);
  REQUIRE(e.type == "ResultEncodeError");
  REQUIRE(e.message.rfind("failed to encode return value as msgpack", 0) == 0);

  e = worker->CallError("worker_fixture::add", "\xc1", 2);
  REQUIRE(e.type == "ArgumentsDecodeError");
}

TEST_CASE("Unknown encodings are refused", "[worker]") {
  auto worker = ReadyWorker();
  ipc::ErrorInfo e =
      worker->CallError("worker_fixture::add", Pickle("((1,), {})"), 7);
  REQUIRE(e.type == "UnsupportedEncoding");
  REQUIRE(e.code == 3);
  // Encoding 0 (unspecified) means pickle.
  REQUIRE(Unpickle(worker->CallOk("worker_fixture::add",
                                  Pickle("((1,), {})"), 0)) == "1");
}

// One call frame for a batch written with SendRaw.
void AppendCall(const std::string& id, const std::string& callable,
                const std::string& args, std::string& batch) {
  Frame call;
  call.type = FrameType::kCall;
  call.call_id = id;
  call.callable = callable;
  call.encoding = 1;
  call.data = args;
  call.total_size = args.size();
  REQUIRE_OK(ipc::AppendFrame(call, batch));
}

TEST_CASE("A burst of short sync calls runs on a few pool threads",
          "[worker][pool]") {
  auto worker = ReadyWorker();
  // Handing each call to a thread of its own costs a wake-up and a GIL
  // hand-off per call; one thread draining the queue costs neither.
  const std::string args = Pickle("((), {})");
  std::set<std::string> ids;
  std::string batch;
  for (int i = 0; i < 300; ++i) {
    ids.insert(absl::StrCat("t", i));
    AppendCall(absl::StrCat("t", i), "worker_fixture::thread_ident", args,
               batch);
  }
  worker->SendRaw(batch);
  std::set<std::string> threads;
  for (auto& [id, reply] : worker->AwaitReplies(ids, absl::Seconds(30))) {
    REQUIRE(reply.ok);
    threads.insert(reply.value);
  }
  INFO(threads.size() << " threads ran 300 short calls");
  REQUIRE(threads.size() <= 8);
}

TEST_CASE("A burst's replies are written as they come, a few at a time",
          "[worker][pool]") {
  auto worker = ReadyWorker();
  // One write at the end of a long burst would leave the daemon and the
  // host idle until the whole burst ran; a write per reply costs a wake-up
  // each. Replies go out every 8 (or sooner: the pool monitor, the end of
  // the queue).
  worker->CallOk("worker_fixture::count_reply_writes", Pickle("((), {})"));
  const std::string args = Pickle("((1, 2), {})");
  std::set<std::string> ids;
  std::string batch;
  for (int i = 0; i < 400; ++i) {
    ids.insert(absl::StrCat("b", i));
    AppendCall(absl::StrCat("b", i), "worker_fixture::add", args, batch);
  }
  worker->SendRaw(batch);
  for (auto& [id, reply] : worker->AwaitReplies(ids, absl::Seconds(30))) {
    REQUIRE(reply.value == std::string("\x80\x05K\x03.", 5));
  }
  const std::string writes = worker->CallOk("worker_fixture::reply_writes",
                                            Pickle("((), {})"));
  INFO("replies per write: " << Unpickle(writes));
  REQUIRE(std::stoi(Unpickle(writes, "max(v)")) <= 8);
  const int total = std::stoi(Unpickle(writes, "sum(v)"));
  REQUIRE(total >= 400);  // the burst's, and count_reply_writes' own
}

TEST_CASE("Short sync calls beside blocking ones reply at once",
          "[worker][pool][timing]") {
  auto worker = ReadyWorker();
  const std::string add = Pickle("((1, 2), {})");
  const std::string sleep = Pickle("((3.0,), {})");
  std::set<std::string> quick, slow;
  std::string batch;
  const auto quick_calls = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      quick.insert(absl::StrCat("a", i));
      AppendCall(absl::StrCat("a", i), "worker_fixture::add", add, batch);
    }
  };
  const auto slow_calls = [&](int n) {
    for (int i = 0; i < n; ++i) {
      slow.insert(absl::StrCat("s", i));
      AppendCall(absl::StrCat("s", i), "worker_fixture::sleep_sync", sleep,
                 batch);
    }
  };
  SECTION("a blocking call after them: their replies are written") {
    // The queue's thread replies to the short calls and then blocks in the
    // sleep, with the last reply queued but not written by it.
    quick_calls(0, 20);
    slow_calls(1);
  }
  SECTION("blocking calls before them: they get other threads") {
    quick_calls(0, 20);
    slow_calls(4);
    quick_calls(20, 40);
  }
  const absl::Time start = absl::Now();
  worker->SendRaw(batch);
  auto replies = worker->AwaitReplies(quick, absl::Seconds(10));
  const absl::Duration took = absl::Now() - start;
  INFO(quick.size() << " short calls beside " << slow.size()
                    << " blocking ones took " << absl::FormatDuration(took));
  REQUIRE(took < absl::Milliseconds(1500));
  for (auto& [id, reply] : replies) {
    REQUIRE(reply.value == std::string("\x80\x05K\x03.", 5));
  }
  for (auto& [id, reply] : worker->AwaitReplies(slow, absl::Seconds(10))) {
    REQUIRE(reply.ok);
  }
}

TEST_CASE("Many pipelined calls", "[worker][timing]") {
  auto worker = ReadyWorker();
  const std::string args = Pickle("((1, 2), {})");
  std::set<std::string> ids;
  std::string batch;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = absl::StrCat("p", i);
    ids.insert(id);
    Frame call;
    call.type = FrameType::kCall;
    call.call_id = id;
    call.callable = i % 2 ? "worker_fixture::async_add" : "worker_fixture::add";
    call.encoding = 1;
    call.data = args;
    call.total_size = args.size();
    REQUIRE_OK(ipc::AppendFrame(call, batch));
  }
  const absl::Time start = absl::Now();
  worker->SendRaw(batch);
  auto replies = worker->AwaitReplies(ids, absl::Seconds(30));
  WARN("1000 pipelined calls took " << absl::FormatDuration(absl::Now() - start));
  for (auto& [id, reply] : replies) {
    REQUIRE(reply.value == std::string("\x80\x05K\x03.", 5));
  }

  const absl::Time seq_start = absl::Now();
  for (int i = 0; i < 500; ++i) worker->CallOk("worker_fixture::async_add", args);
  WARN("sequential async round trip: "
       << absl::FormatDuration((absl::Now() - seq_start) / 500));
  const absl::Time sync_start = absl::Now();
  for (int i = 0; i < 500; ++i) worker->CallOk("worker_fixture::add", args);
  WARN("sequential sync round trip: "
       << absl::FormatDuration((absl::Now() - sync_start) / 500));
}

}  // namespace
}  // namespace agentix::worker
