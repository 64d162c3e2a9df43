// Log records, trace events and namespace events on the log queue.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "testing/status_matchers.h"
#include "worker/channel/channel_test_util.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/io.h"
#include "worker/ipc/payload_area.h"

namespace agentix::worker {
namespace {

using runtime::v1::LogRecord;
using runtime::v1::TraceEvent;

// The record a `log` frame carries; fails the test if it does not parse.
LogRecord RecordOf(const ipc::Frame& frame) {
  REQUIRE(frame.type == ipc::FrameType::kLog);
  LogRecord record;
  REQUIRE(record.ParseFromString(frame.record));
  return record;
}

// The event a `trace` frame carries; fails the test if it does not parse.
TraceEvent EventOf(const ipc::Frame& frame) {
  REQUIRE(frame.type == ipc::FrameType::kTrace);
  TraceEvent event;
  REQUIRE(event.ParseFromString(frame.record));
  return event;
}

TEST_CASE("Namespace events go out without a flush, after earlier records",
          "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  // The first record starts the log sender; the event after the second is
  // then written by the emitting thread itself (see SendSideChannelFrameNow),
  // queued records first. Neither needs flush().
  Py("ch.send_log(logger='lg', message='one', call_id='c')\n"
     "ch.send_log(logger='lg', message='two', call_id='c')\n"
     "ch.send_ns_event('/plugin', 'ask', b'\\x81', 'r1', None, '', 0)\n"
     "ch.send_ns_event('/plugin', 'fail', None, 'r2', 'KeyError', 'k', 404)\n");
  auto frames = collector.Wait(4, absl::Seconds(5));
  REQUIRE(frames.size() == 4);
  REQUIRE(RecordOf(frames[0]).message() == "one");
  REQUIRE(RecordOf(frames[1]).message() == "two");
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

TEST_CASE("wait_cpu is the CPU the daemon publishes in the payload area",
          "[channel]") {
  {
    Pair pair;  // no payload area: never a CPU
    REQUIRE(PyEval("ch.wait_cpu()") == "-1");
  }
  RingPair pair(1 << 16);
  REQUIRE(PyEval("ch.wait_cpu()") == "-1");  // none published yet
  pair.daemon->PublishWaitCpu(3);
  REQUIRE(PyEval("ch.wait_cpu()") == "3");
  pair.daemon->PublishWaitCpu(0);
  REQUIRE(PyEval("ch.wait_cpu()") == "0");
  pair.daemon->PublishWaitCpu(-1);  // the daemon unpinned its call path
  REQUIRE(PyEval("ch.wait_cpu()") == "-1");
}

TEST_CASE("A record queued while the log sender sleeps wakes it", "[channel]") {
  // Producers wake the sender only when it sleeps (Writer::sender_asleep):
  // each record here is queued after the previous one went out, mostly with
  // the sender asleep, sometimes while it is still finishing its write.
  Pair pair;
  FrameCollector collector(pair.peer);
  for (int i = 0; i < 40; ++i) {
    Py(absl::StrCat("ch.send_log(logger='lg', message='r", i,
                    "', call_id='c')\n"));
    auto frames = collector.Wait(i + 1, absl::Seconds(5));
    REQUIRE(frames.size() == static_cast<size_t>(i + 1));
    REQUIRE(RecordOf(frames[i]).message() == absl::StrCat("r", i));
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
      "            ch.send_log(logger='lg', message=f'{t} {i}', "
      "call_id='c')\n"
      "        else:\n"
      "            ch.send_trace(kind=3, agentix_trace_id=f'{t} {i}', "
      "agentix_span_id='span_1', name='s', start_time_unix_nanos=1, "
      "attributes={'k': i}, call_id='c')\n"
      "threads = [threading.Thread(target=produce, args=(t,)) for t in range(",
      kThreads,
      ")]\n"
      "for thread in threads: thread.start()\n"
      "for thread in threads: thread.join()\n"));
  auto frames = collector.Wait(kThreads * kEach, absl::Seconds(20));
  REQUIRE(frames.size() == static_cast<size_t>(kThreads * kEach));
  std::vector<int> next(kThreads, 0);
  for (const ipc::Frame& frame : frames) {
    const std::string text = frame.type == ipc::FrameType::kLog
                                 ? RecordOf(frame).message()
                                 : EventOf(frame).agentix_trace_id();
    const int t = text[0] - '0';
    REQUIRE(t >= 0);
    REQUIRE(t < kThreads);
    REQUIRE(text == absl::StrCat(t, " ", next[t]));
    REQUIRE((frame.type == ipc::FrameType::kTrace) == (next[t] % 3 == 0));
    ++next[t];
  }
}

TEST_CASE("Log records and trace events cross the edge by field name",
          "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  // Every field, named, in an order of its own; then the defaults.
  Py("ch.send_log(stack_info='st', extras=b'\\x80', context='ctx', "
     "call_id='c\\udcff', origin=2, exception_text='exc', module='mod', "
     "function='fn', line=7, file='f.py', time_unix_nanos=5_000_000_000_123, "
     "message='msg', level_name='WARNING', level=30, logger='lg')\n"
     "ch.send_log(message='bare')\n"
     "ch.send_trace(kind=3, agentix_trace_id='t', agentix_span_id='s', "
     "agentix_parent_id='p', name='n', start_time_unix_nanos=1, "
     "end_time_unix_nanos=2, attributes={'a': 'x', 'n': 3}, "
     "events=[{'name': 'ev', 'time_unix_nanos': 9, 'attributes': {'f': 0.5}},"
     " {}], status=2, status_description='d', error_message='e', "
     "error_data={'code': b'\\x81'}, call_id='c')\n");
  auto frames = collector.Wait(3, absl::Seconds(5));
  REQUIRE(frames.size() == 3);
  const LogRecord log = RecordOf(frames[0]);
  CHECK(log.logger() == "lg");
  CHECK(log.level() == 30);
  CHECK(log.level_name() == "WARNING");
  CHECK(log.message() == "msg");
  CHECK(log.time_unix_nanos() == 5000000000123);
  CHECK(log.file() == "f.py");
  CHECK(log.line() == 7);
  CHECK(log.function() == "fn");
  CHECK(log.module() == "mod");
  CHECK(log.exception_text() == "exc");
  CHECK(log.origin() == runtime::v1::LOG_ORIGIN_STDOUT);
  // proto3 strings are UTF-8: a lone surrogate is escaped, not sent raw.
  CHECK(log.call_id() == "c\\udcff");
  CHECK(log.context() == "ctx");
  CHECK(log.extras() == "\x80");
  CHECK(log.stack_info() == "st");
  CHECK(log.seq() == 0);
  CHECK(log.worker_id().empty());
  // Omitted fields keep proto3's defaults.
  const LogRecord bare = RecordOf(frames[1]);
  CHECK(bare.message() == "bare");
  CHECK(bare.level() == 0);
  CHECK(bare.origin() == runtime::v1::LOG_ORIGIN_UNSPECIFIED);
  CHECK(bare.logger().empty());
  CHECK(bare.extras().empty());
  const TraceEvent t = EventOf(frames[2]);
  CHECK(t.kind() == runtime::v1::TRACE_EVENT_KIND_SPAN_START);
  CHECK(t.agentix_trace_id() == "t");
  CHECK(t.agentix_span_id() == "s");
  CHECK(t.agentix_parent_id() == "p");
  CHECK(t.name() == "n");
  CHECK(t.start_time_unix_nanos() == 1);
  CHECK(t.end_time_unix_nanos() == 2);
  REQUIRE(t.attributes_size() == 2);
  CHECK(t.attributes(0).key() == "a");
  CHECK(t.attributes(0).value().string_value() == "x");
  CHECK(t.attributes(1).key() == "n");
  CHECK(t.attributes(1).value().int_value() == 3);
  REQUIRE(t.events_size() == 2);
  CHECK(t.events(0).name() == "ev");
  CHECK(t.events(0).time_unix_nanos() == 9);
  REQUIRE(t.events(0).attributes_size() == 1);
  CHECK(t.events(0).attributes(0).value().double_value() == 0.5);
  CHECK(t.events(1).name().empty());  // an empty dict: an event all default
  CHECK(t.status() == runtime::v1::SPAN_STATUS_CODE_ERROR);
  CHECK(t.status_description() == "d");
  CHECK(t.error_message() == "e");
  REQUIRE(t.error_data_size() == 1);
  CHECK(t.error_data(0).value().bytes_value() == "\x81");
  CHECK(t.call_id() == "c");
  CHECK(t.seq() == 0);

  // Positional arguments, unknown names and wrong types are refused and
  // send nothing.
  CHECK(Raised("ch.send_log('lg', 20)", "TypeError") ==
        "send_log() takes keyword arguments only");
  CHECK(Raised("ch.send_log(mesage='typo')", "TypeError") ==
        "send_log() got an unexpected keyword argument 'mesage'");
  CHECK(Raised("ch.send_log(level='high')", "TypeError") ==
        "level must be int, not str");
  CHECK(Raised("ch.send_log(line=1 << 40)", "ValueError") ==
        "line out of range");
  CHECK(Raised("ch.send_log(origin=9)", "ValueError") ==
        "origin must be a value of agentix.runtime.v1.LogOrigin");
  CHECK(Raised("ch.send_log(extras='text')", "TypeError") != kNoError);
  // The daemon's fields are not the worker's to set.
  CHECK(Raised("ch.send_log(seq=1)", "TypeError") ==
        "send_log() got an unexpected keyword argument 'seq'");
  CHECK(Raised("ch.send_log(worker_id='w')", "TypeError") ==
        "send_log() got an unexpected keyword argument 'worker_id'");
  // The daemon derives the OpenTelemetry ids from the agentix ones.
  for (const char* daemon_owned :
       {"seq", "trace_id", "span_id", "parent_span_id", "worker_id"}) {
    CHECK(Raised(absl::StrCat("ch.send_trace(", daemon_owned, "=1)"),
                 "TypeError") ==
          absl::StrCat("send_trace() got an unexpected keyword argument '",
                       daemon_owned, "'"));
  }
  CHECK(Raised("ch.send_trace(kind=9)", "ValueError") ==
        "kind must be a value of agentix.runtime.v1.TraceEventKind");
  CHECK(Raised("ch.send_trace(status=3)", "ValueError") ==
        "status must be a value of agentix.runtime.v1.SpanStatusCode");
  // Message fields take their Python forms only.
  CHECK(Raised("ch.send_trace(attributes=[('k', 1)])", "TypeError") ==
        "attributes must be a dict, not list");
  CHECK(Raised("ch.send_trace(attributes={'k': object()})", "TypeError") ==
        "a agentix.runtime.v1.AttributeValue cannot hold a object");
  CHECK(Raised("ch.send_trace(attributes={'k': 1 << 64})",
               "OverflowError") != kNoError);
  CHECK(Raised("ch.send_trace(attributes={1: 'v'})", "TypeError") !=
        kNoError);
  CHECK(Raised("ch.send_trace(events={'name': 'x'})", "TypeError") ==
        "events must be a list or tuple, not dict");
  CHECK(Raised("ch.send_trace(events=['x'])", "TypeError") ==
        "a agentix.runtime.v1.SpanEventRecord must be a dict, not str");
  CHECK(Raised("ch.send_trace(events=[{'nme': 'x'}])", "TypeError") ==
        "agentix.runtime.v1.SpanEventRecord has no field 'nme'");
  CHECK(Raised("ch.send_trace(events=[{1: 'x'}])", "TypeError") ==
        "a agentix.runtime.v1.SpanEventRecord's keys must be field names "
        "(str)");
  Py("ch.send_log(message='last')\n");
  frames = collector.Wait(4, absl::Seconds(5));
  REQUIRE(frames.size() == 4);
  CHECK(RecordOf(frames[3]).message() == "last");
}

TEST_CASE("send_log's bytes are the LogRecord protobuf itself parses",
          "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  // Negative ints (10-byte varints), zeros (left out), non-ASCII text and
  // long bytes, against the generated parser.
  Py("ch.send_log(line=-5, level=0, time_unix_nanos=-1, message='h\u00e9 "
     "\u2603', logger='', extras=bytes(range(256)) * 4, origin=0)\n");
  auto frames = collector.Wait(1, absl::Seconds(5));
  REQUIRE(frames.size() == 1);
  const LogRecord log = RecordOf(frames[0]);
  CHECK(log.line() == -5);
  CHECK(log.level() == 0);
  CHECK(log.time_unix_nanos() == -1);
  CHECK(log.message() == "h\xc3\xa9 \xe2\x98\x83");
  CHECK(log.extras().size() == 1024);
  CHECK(log.extras()[255] == '\xff');
  LogRecord want;
  want.set_line(-5);
  want.set_time_unix_nanos(-1);
  want.set_message(log.message());
  want.set_extras(log.extras());
  CHECK(log.SerializeAsString() == want.SerializeAsString());
}

TEST_CASE("send_trace's bytes are the TraceEvent protobuf itself parses",
          "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  // Each attribute kind, at its zero too: a oneof member is written even
  // when default (else the host could not tell 0 from "no value"). Keywords
  // in field order, so the bytes equal the generated serializer's.
  Py("ch.send_trace(kind=4, agentix_trace_id='trace_\u00e9', name='s', "
     "start_time_unix_nanos=-1, attributes={'s': '', 'b': False, 'i': 0, "
     "'f': 0.0, 'y': b'', 'n': -2, 'u': 'h\u00e9', 't': True, 'g': -1.5, "
     "'x': bytearray(b'\\x00\\xff')}, events=[{'name': 'e', "
     "'time_unix_nanos': 3, 'attributes': {'k': 1}}], status=1, "
     "call_id='c')\n");
  auto frames = collector.Wait(1, absl::Seconds(5));
  REQUIRE(frames.size() == 1);
  TraceEvent want;
  want.set_kind(runtime::v1::TRACE_EVENT_KIND_SPAN_END);
  want.set_agentix_trace_id("trace_\xc3\xa9");
  want.set_name("s");
  want.set_start_time_unix_nanos(-1);
  auto add = [&want](const char* key) {
    runtime::v1::Attribute* a = want.add_attributes();
    a->set_key(key);
    return a->mutable_value();
  };
  add("s")->set_string_value("");
  add("b")->set_bool_value(false);
  add("i")->set_int_value(0);
  add("f")->set_double_value(0.0);
  add("y")->set_bytes_value("");
  add("n")->set_int_value(-2);
  add("u")->set_string_value("h\xc3\xa9");
  add("t")->set_bool_value(true);
  add("g")->set_double_value(-1.5);
  add("x")->set_bytes_value(std::string("\x00\xff", 2));
  runtime::v1::SpanEventRecord* event = want.add_events();
  event->set_name("e");
  event->set_time_unix_nanos(3);
  runtime::v1::Attribute* k = event->add_attributes();
  k->set_key("k");
  k->mutable_value()->set_int_value(1);
  want.set_status(runtime::v1::SPAN_STATUS_CODE_OK);
  want.set_call_id("c");
  const TraceEvent got = EventOf(frames[0]);
  CHECK(got.attributes(1).value().has_bool_value());
  CHECK(got.attributes(2).value().has_int_value());
  CHECK(got.attributes(3).value().has_double_value());
  CHECK(got.attributes(4).value().has_bytes_value());
  CHECK(got.DebugString() == want.DebugString());
  CHECK(frames[0].record == want.SerializeAsString());
}

TEST_CASE("send_log_record sends what the bridge's send_log call would",
          "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  // Each record goes out twice: through send_log_record, then through the
  // keyword call the bridge's general path makes (worker/driver/logs.py
  // _LogBridge.emit); the two frames must be byte for byte the same.
  Py("import logging\n"
     "STD = frozenset(vars(logging.LogRecord('n', 20, 'p', 1, 'm', None, "
     "None))) | {'message', 'asctime', 'agentix_context'}\n"
     "UNFORWARDED = ('agentix.utils.log',)\n"
     "def general(r, context, call_id):\n"
     "    ctx = getattr(r, 'agentix_context', None)\n"
     "    ch.send_log(logger=r.name, level=r.levelno, "
     "level_name=r.levelname, message=r.getMessage(), "
     "time_unix_nanos=int(r.created * 1e9), file=r.pathname or '', "
     "line=r.lineno or 0, function=r.funcName or '', module=r.module or '', "
     "exception_text=r.exc_text or '', origin=1, call_id=call_id, "
     "context=ctx if isinstance(ctx, str) else context, extras=None, "
     "stack_info=r.stack_info or '')\n"
     "def rec(msg, args=None, name='app.x', level=20, **attrs):\n"
     "    r = logging.LogRecord(name, level, '/src/f\\u00e9.py', 12, msg, "
     "args, None, func='fn')\n"
     "    for k, v in attrs.items(): setattr(r, k, v)\n"
     "    return r\n"
     "records = [\n"
     "    rec('hello %s %d', ('w\\u00e9', 3)),\n"
     "    rec('ctx', agentix_context='sandbox-h-worker-1'),\n"
     "    rec({'k': [1, 2]}),\n"
     "    rec('v=%(a)s', ({'a': 5},)),\n"
     "    rec('bad \\udcff text', level=40, exc_info=(ValueError, "
     "ValueError('x'), None), exc_text='Traceback: ...'),\n"
     "    rec('stack', stack_info='Stack (most recent call last):\\n  x'),\n"
     "    rec('nones', pathname=None, lineno=None, funcName=None, "
     "module=None, levelno=0, created=0.0),\n"
     "    rec('neg', lineno=-3, created=-1.5, agentix_context=42),\n"
     "    rec('agentix.utils is forwarded', name='agentix.utils'),\n"
     "]\n"
     "for r in records:\n"
     "    assert ch.send_log_record(r, 'dflt', 'call-1', STD, UNFORWARDED)"
     " is True, r\n"
     "    general(r, 'dflt', 'call-1')\n");
  constexpr size_t kRecords = 9;
  auto frames = collector.Wait(2 * kRecords, absl::Seconds(5));
  REQUIRE(frames.size() == 2 * kRecords);
  for (size_t i = 0; i < kRecords; ++i) {
    INFO("record " << i);
    CHECK(frames[2 * i].record == frames[2 * i + 1].record);
  }
  const LogRecord first = RecordOf(frames[0]);
  CHECK(first.logger() == "app.x");
  CHECK(first.message() == "hello w\xc3\xa9 3");
  CHECK(first.level_name() == "INFO");
  CHECK(first.file() == "/src/f\xc3\xa9.py");
  CHECK(first.line() == 12);
  CHECK(first.function() == "fn");
  CHECK(first.module() == "f\xc3\xa9");
  CHECK(first.context() == "dflt");
  CHECK(first.call_id() == "call-1");
  CHECK(first.origin() == runtime::v1::LOG_ORIGIN_LOGGING);
  CHECK(first.time_unix_nanos() > 0);
  CHECK(RecordOf(frames[2]).context() == "sandbox-h-worker-1");
  CHECK(RecordOf(frames[4]).message() == "{'k': [1, 2]}");
  CHECK(RecordOf(frames[6]).message() == "v=5");
  CHECK(RecordOf(frames[8]).message() == "bad \\udcff text");
  CHECK(RecordOf(frames[8]).exception_text() == "Traceback: ...");
  CHECK(RecordOf(frames[14]).time_unix_nanos() == -1500000000);
  CHECK(RecordOf(frames[14]).context() == "dflt");
}

TEST_CASE("send_log_record's standard keys remembered from one record do "
          "not admit another's extras", "[channel]") {
  // The keys found standard are remembered by position and identity; a
  // record whose dict differs there, or a call with other standard keys,
  // must still be checked against the set.
  Pair pair;
  FrameCollector collector(pair.peer);
  Py("import logging\n"
     "STD = frozenset(vars(logging.LogRecord('n', 20, 'p', 1, 'm', None, "
     "None))) | {'message', 'asctime', 'agentix_context'}\n"
     "def rec(msg='m'):\n"
     "    return logging.LogRecord('app.x', 20, 'p.py', 1, msg, None, None)\n"
     "assert ch.send_log_record(rec('first'), 'd', '', STD, ()) is True\n"
     "swapped = rec()\n"
     "del swapped.module\n"
     "swapped.user = 'ada'\n"
     "assert ch.send_log_record(swapped, 'd', '', STD, ()) is False\n"
     "assert ch.send_log_record(rec(), 'd', '', STD - {'module'}, ()) is False\n"
     "copied = rec('equal keys, other objects')\n"
     "copied.__dict__ = {''.join(list(k)): v for k, v in vars(copied).items()}\n"
     "assert ch.send_log_record(copied, 'd', '', STD, ()) is True\n"
     "assert ch.send_log_record(rec('last'), 'd', '', STD, ()) is True\n");
  auto frames = collector.Wait(3, absl::Seconds(5));
  REQUIRE(frames.size() == 3);
  CHECK(RecordOf(frames[0]).message() == "first");
  CHECK(RecordOf(frames[1]).message() == "equal keys, other objects");
  CHECK(RecordOf(frames[2]).message() == "last");
}

TEST_CASE("A record's message is made again unless its inputs are the "
          "same immutable objects", "[channel]") {
  // The bridge and the durable log format each record in turn; the second
  // gets the first's message only for the same str msg and tuple of str /
  // int / float args. A mutable or user-defined argument is formatted anew.
  Py("import logging, tempfile\n"
     "out = tempfile.TemporaryFile()\n"
     "def line(record):\n"
     "    assert w.write_log_line(record, out.fileno(), 'c', -1) > 0\n"
     "    return record.message\n"
     "def rec(msg, args):\n"
     "    return logging.LogRecord('n', 20, 'p.py', 1, msg, args, None)\n"
     "same = ('n %d %s', (5, 'x'))\n"
     "first, second = rec(*same), rec(*same)\n"
     "assert line(first) == 'n 5 x' and line(second) is first.message\n"
     "items = ['a']\n"
     "listed = ('items %s', (items,))\n"
     "assert line(rec(*listed)) == \"items ['a']\"\n"
     "items.append('b')\n"
     "assert line(rec(*listed)) == \"items ['a', 'b']\"\n"
     "class Counted:\n"
     "    calls = 0\n"
     "    def __str__(self):\n"
     "        Counted.calls += 1\n"
     "        return f'counted {Counted.calls}'\n"
     "counted = rec('%s', (Counted(),))\n"
     "assert (line(counted), line(counted)) == ('counted 1', 'counted 2')\n"
     "msg = 'v %d'\n"
     "assert (line(rec(msg, (1,))), line(rec(msg, (2,)))) == ('v 1', 'v 2')\n"
     "args = (3,)\n"
     "assert (line(rec('a %d', args)), line(rec('b %d', args))) == ('a 3', 'b 3')\n"
     "out.seek(0)\n"
     "lines = [l.split('] ', 2)[2] for l in out.read().decode().splitlines()]\n"
     "assert lines == ['n 5 x', 'n 5 x', \"items ['a']\", \"items ['a', 'b']\",\n"
     "                 'counted 1', 'counted 2', 'v 1', 'v 2', 'a 3', 'b 3'], lines\n");
}

TEST_CASE("send_log_record declines every other record, sending nothing",
          "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  Py("import logging\n"
     "STD = frozenset(vars(logging.LogRecord('n', 20, 'p', 1, 'm', None, "
     "None))) | {'message', 'asctime', 'agentix_context'}\n"
     "def rec(msg='m', args=None, name='app.x', **attrs):\n"
     "    r = logging.LogRecord(name, 20, 'p.py', 1, msg, args, None)\n"
     "    for k, v in attrs.items(): setattr(r, k, v)\n"
     "    return r\n"
     "class Sub(logging.LogRecord):\n"
     "    pass\n"
     "class Unprintable:\n"
     "    def __str__(self): raise RuntimeError('no')\n"
     "declined = [\n"
     "    Sub('app.x', 20, 'p.py', 1, 'm', None, None),\n"
     "    rec(user='ada'),\n"
     "    rec(_private=1),\n"
     "    rec(exc_info=(ValueError, ValueError('x'), None)),\n"
     "    rec(exc_info=False),\n"
     "    rec(name='agentix.utils.log'),\n"
     "    rec(name='agentix.utils.log.inner'),\n"
     "    rec(name='agentix.utils.logx'),\n"
     "    rec(Unprintable()),\n"
     "    rec('%d', ('x',)),\n"
     "    rec('%s %s', ('one',)),\n"
     "    rec(levelno='20'),\n"
     "    rec(levelname=None),\n"
     "    rec(pathname=b'p.py'),\n"
     "    rec(lineno=1.5),\n"
     "    rec(created=float('nan')),\n"
     "    rec(created=1e20),\n"
     "    rec(created=1),\n"
     "    rec(agentix_context=type('S', (str,), {})('ctx')),\n"
     "]\n"
     "for r in declined:\n"
     "    assert ch.send_log_record(r, 'd', '', STD, ('agentix.utils.log',))"
     " is False, vars(r)\n"
     "saved = logging.LogRecord.getMessage\n"
     "logging.LogRecord.getMessage = lambda self: 'replaced'\n"
     "try:\n"
     "    assert ch.send_log_record(rec(), 'd', '', STD, ()) is False\n"
     "finally:\n"
     "    logging.LogRecord.getMessage = saved\n"
     "assert ch.send_log_record(rec('sent'), 'd', '', STD, ()) is True\n");
  auto frames = collector.Wait(1, absl::Seconds(5));
  REQUIRE(frames.size() == 1);
  CHECK(RecordOf(frames[0]).message() == "sent");
  CHECK(Raised("ch.send_log_record(rec(), 'd', '', set(), ())",
               "TypeError") ==
        "send_log_record: standard_keys must be a frozenset and unforwarded "
        "a tuple");
  CHECK(Raised("ch.send_log_record(rec())", "TypeError") ==
        "send_log_record() takes 5 arguments (1 given)");
}

TEST_CASE("send_span sends what the trace forwarder's send_trace call would",
          "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  // Each span event goes out twice: through send_span, then through the
  // keyword call of the forwarder's general path (worker/driver/traces.py),
  // with the stamps converted by calendar.timegm here.
  Py("import calendar, dataclasses\n"
     "@dataclasses.dataclass\n"
     "class Span:\n"
     "    span_id: str\n"
     "    trace_id: str\n"
     "    parent_id: object\n"
     "    name: str\n"
     "    attrs: dict = dataclasses.field(default_factory=dict)\n"
     "    started_at: object = None\n"
     "    ended_at: object = None\n"
     "    status: object = 'unset'\n"
     "    status_description: object = None\n"
     "    error: object = None\n"
     "    events: list = dataclasses.field(default_factory=list)\n"
     "def nanos(stamp):\n"
     "    if stamp is None: return 0\n"
     "    head = [int(stamp[0:4]), int(stamp[5:7]), int(stamp[8:10]), "
     "int(stamp[11:13]), int(stamp[14:16]), int(stamp[17:19])]\n"
     "    return calendar.timegm(head) * 10**9 + int(stamp[20:26]) * 1000\n"
     "def general(kind, s):\n"
     "    common = dict(kind=kind, agentix_trace_id=s.trace_id, "
     "agentix_span_id=s.span_id, agentix_parent_id=s.parent_id or '', "
     "name=s.name, start_time_unix_nanos=nanos(s.started_at))\n"
     "    if kind == 3:\n"
     "        ch.send_trace(**common, attributes=s.attrs or None, "
     "call_id='c')\n"
     "    else:\n"
     "        ch.send_trace(**common, end_time_unix_nanos=nanos(s.ended_at), "
     "attributes=s.attrs or None, status={'unset': 0, 'ok': 1, "
     "'error': 2}.get(s.status, 0), call_id='c')\n"
     "attrs = {'i': 1, 's': 'x\\u00e9', 'f': 1.5, 'b': True, 'y': b'z', "
     "'n': -2**63, 'z': 0, 'e': ''}\n"
     "spans = [\n"
     "    Span('span_1', 'trace_1', None, 'plan', dict(attrs), "
     "'2026-12-02T11:35:17.123456Z', '2026-12-02T11:35:18.000001Z', 'ok'),\n"
     "    Span('span_2', 'trace_1', 'span_1', '', {}, None, None, 'error'),\n"
     "    Span('span_3', 'trace_1', '', 'leap', {'k': False}, "
     "'2024-02-29T23:59:59.999999Z', '2024-03-01T00:00:00.000000Z', "
     "'weird'),\n"
     "    Span('span_4', 'trace_unbound', None, 'old', {}, "
     "'1678-01-01T00:00:00.000001Z', '1970-01-01T00:00:00.000000Z'),\n"
     "    Span('span_5', 'trace_1', None, 'far', {}, "
     "'2262-01-01T23:59:59.999999Z', '2000-01-01T00:00:00.500000Z'),\n"
     "]\n"
     "for s in spans:\n"
     "    for kind in (3, 4):\n"
     "        assert ch.send_span(kind, s, 'c', Span) is True, (kind, s)\n"
     "        general(kind, s)\n");
  constexpr size_t kEvents = 10;
  auto frames = collector.Wait(2 * kEvents, absl::Seconds(5));
  REQUIRE(frames.size() == 2 * kEvents);
  for (size_t i = 0; i < kEvents; ++i) {
    INFO("event " << i);
    CHECK(frames[2 * i].record == frames[2 * i + 1].record);
  }
  const TraceEvent end = EventOf(frames[2]);
  CHECK(end.kind() == runtime::v1::TRACE_EVENT_KIND_SPAN_END);
  CHECK(end.agentix_span_id() == "span_1");
  CHECK(end.name() == "plan");
  CHECK(end.start_time_unix_nanos() == 1796211317123456000LL);
  CHECK(end.end_time_unix_nanos() == 1796211318000001000LL);
  CHECK(end.attributes_size() == 8);
  CHECK(end.status() == runtime::v1::SPAN_STATUS_CODE_OK);
  CHECK(end.call_id() == "c");
  CHECK(EventOf(frames[6]).status() == runtime::v1::SPAN_STATUS_CODE_ERROR);
}

TEST_CASE("send_span declines every other span, sending nothing",
          "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  Py("import dataclasses, datetime\n"
     "@dataclasses.dataclass\n"
     "class Span:\n"
     "    span_id: object = 'span_1'\n"
     "    trace_id: object = 'trace_1'\n"
     "    parent_id: object = None\n"
     "    name: object = 'n'\n"
     "    attrs: object = dataclasses.field(default_factory=dict)\n"
     "    started_at: object = '2026-12-02T11:35:17.123456Z'\n"
     "    ended_at: object = '2026-12-02T11:35:17.123457Z'\n"
     "    status: object = 'unset'\n"
     "    status_description: object = None\n"
     "    error: object = None\n"
     "    events: object = dataclasses.field(default_factory=list)\n"
     "class Sub(Span):\n"
     "    pass\n"
     "class Text(str):\n"
     "    pass\n"
     "class Real(float):\n"
     "    pass\n"
     "both = [\n"
     "    Sub(),\n"
     "    Span(attrs={'k': None}),\n"
     "    Span(attrs={'k': object()}),\n"
     "    Span(attrs={1: 'v'}),\n"
     "    Span(attrs={'k': 2**63}),\n"
     "    Span(attrs={'k': Real(1.0)}),\n"
     "    Span(attrs={'k': Text('v')}),\n"
     "    Span(attrs={'k': [1]}),\n"
     "    Span(attrs=[('k', 1)]),\n"
     "    Span(started_at=datetime.datetime(2026, 12, 2)),\n"
     "    Span(started_at='2026-12-02 11:35:17.123456Z'),\n"
     "    Span(started_at='2026-12-02T11:35:17.12345Z'),\n"
     "    Span(started_at='2026-13-02T11:35:17.123456Z'),\n"
     "    Span(started_at='0000-01-02T11:35:17.123456Z'),\n"
     "    Span(started_at='0001-01-01T00:00:00.000001Z'),\n"
     "    Span(started_at='9999-12-31T23:59:59.999999Z'),\n"
     "    Span(started_at='2026-12-02T11:35:17.12345\\u0663Z'),\n"
     "    Span(trace_id=1),\n"
     "    Span(span_id=Text('span_1')),\n"
     "    Span(parent_id=7),\n"
     "    Span(name=None),\n"
     "]\n"
     "end_only = [\n"
     "    Span(events=['e']),\n"
     "    Span(error='boom'),\n"
     "    Span(status_description='why'),\n"
     "    Span(status=Text('ok')),\n"
     "    Span(status=None),\n"
     "    Span(ended_at=0),\n"
     "]\n"
     "for s in both:\n"
     "    for kind in (3, 4):\n"
     "        assert ch.send_span(kind, s, 'c', Span) is False, (kind, s)\n"
     "for s in end_only:\n"
     "    assert ch.send_span(4, s, 'c', Span) is False, s\n"
     "assert ch.send_span(3, Span(name='sent'), 'c', Span) is True\n");
  auto frames = collector.Wait(1, absl::Seconds(5));
  REQUIRE(frames.size() == 1);
  CHECK(EventOf(frames[0]).name() == "sent");
  CHECK(Raised("ch.send_span(2, Span(), 'c', Span)", "TypeError") ==
        "send_span: kind must be 3 or 4 and span_type a class");
}

}  // namespace
}  // namespace agentix::worker
