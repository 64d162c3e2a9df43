// Log records, trace events and namespace events on the log queue.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "testing/status_matchers.h"
#include "worker/channel/channel_test_util.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/io.h"
#include "worker/ipc/payload_area.h"

namespace agentix::worker {
namespace {

TEST_CASE("Namespace events go out without a flush, after earlier records",
          "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  // The first record starts the log sender; the event after the second is
  // then written by the emitting thread itself (see SendSideChannelFrameNow),
  // queued records first. Neither needs flush().
  Py("ch.send_log('lg', 20, 'INFO', 'one', 1, 'f.py', 1, 'fn', 'm', '', 1, "
     "'c', '', None, '')\n"
     "ch.send_log('lg', 20, 'INFO', 'two', 1, 'f.py', 1, 'fn', 'm', '', 1, "
     "'c', '', None, '')\n"
     "ch.send_ns_event('/plugin', 'ask', b'\\x81', 'r1', None, '', 0)\n"
     "ch.send_ns_event('/plugin', 'fail', None, 'r2', 'KeyError', 'k', 404)\n");
  auto frames = collector.Wait(4, absl::Seconds(5));
  REQUIRE(frames.size() == 4);
  REQUIRE(frames[0].log.message == "one");
  REQUIRE(frames[1].log.message == "two");
  REQUIRE(frames[2].type == ipc::FrameType::kNamespaceEvent);
  REQUIRE(frames[2].ns.name == "/plugin");
  REQUIRE(frames[2].ns.event == "ask");
  REQUIRE(frames[2].ns.request_id == "r1");
  REQUIRE(frames[2].data == "\x81");
  REQUIRE_FALSE(frames[2].ns.has_error);
  REQUIRE(frames[3].ns.event == "fail");
  REQUIRE(frames[3].ns.has_error);
  REQUIRE(frames[3].ns.error_type == "KeyError");
  REQUIRE(frames[3].ns.status_code == 404);
}

TEST_CASE("A record queued while the log sender sleeps wakes it", "[channel]") {
  // Producers wake the sender only when it sleeps (Writer::sender_asleep):
  // each record here is queued after the previous one went out, mostly with
  // the sender asleep, sometimes while it is still finishing its write.
  Pair pair;
  FrameCollector collector(pair.peer);
  for (int i = 0; i < 40; ++i) {
    Py(absl::StrCat("ch.send_log('lg', 20, 'INFO', 'r", i,
                    "', 1, 'f.py', 1, 'fn', 'm', '', 1, 'c', '', None, '')\n"));
    auto frames = collector.Wait(i + 1, absl::Seconds(5));
    REQUIRE(frames.size() == static_cast<size_t>(i + 1));
    REQUIRE(frames[i].log.message == absl::StrCat("r", i));
    if (i % 2 == 0) usleep(1000);
  }
}

TEST_CASE(
    "Records and trace events from several threads all go out, each "
    "thread's in order",
    "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  constexpr int kThreads = 4, kEach = 3000;
  Py(absl::StrCat(
      "import threading\n"
      "def produce(t):\n"
      "    for i in range(",
      kEach,
      "):\n"
      "        if i % 3:\n"
      "            ch.send_log('lg', 20, 'INFO', f'{t} {i}', 1, 'f.py', 1, "
      "'fn', 'm', '', 1, 'c', '', None, '')\n"
      "        else:\n"
      "            ch.send_trace(3, f'{t} {i}', 'span_1', '', 's', 1, 0, None, "
      "None, 0, '', '', None, 'c')\n"
      "threads = [threading.Thread(target=produce, args=(t,)) for t in range(",
      kThreads,
      ")]\n"
      "for thread in threads: thread.start()\n"
      "for thread in threads: thread.join()\n"));
  auto frames = collector.Wait(kThreads * kEach, absl::Seconds(20));
  REQUIRE(frames.size() == static_cast<size_t>(kThreads * kEach));
  std::vector<int> next(kThreads, 0);
  for (const ipc::Frame& frame : frames) {
    const std::string& text = frame.type == ipc::FrameType::kLog
                                  ? frame.log.message
                                  : frame.trace.trace_id;
    const int t = text[0] - '0';
    REQUIRE(t >= 0);
    REQUIRE(t < kThreads);
    REQUIRE(text == absl::StrCat(t, " ", next[t]));
    REQUIRE((frame.type == ipc::FrameType::kTrace) == (next[t] % 3 == 0));
    ++next[t];
  }
}

}  // namespace
}  // namespace agentix::worker
