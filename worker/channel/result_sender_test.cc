// Replies: results (chunked, in place, via the ring), items, errors, the
// send queue and its failures.
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

TEST_CASE("send_error carries an exception's class and bounded state",
          "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  Py("ch.send_error('a', 2, 'KeyError', \"'k'\", 'tb', False, 'builtins',\n"
     "              'KeyError', b'\\x80\\x04state')\n"
     "ch.send_error('b', 2, 'ValueError', 'big', '', False, 'builtins',\n"
     "              'ValueError', b'x' * (64 * 1024 + 1))\n"
     "ch.send_error('c', 2, 'E', 'm', '', False, 'mod', 'E', None)\n"
     "try:\n"
     "    ch.send_error('d', 2, 'E', 'm', '', False, 'mod')\n"
     "except TypeError:\n"
     "    pass\n"
     "else:\n"
     "    raise AssertionError('7 arguments accepted')\n"
     "ch.flush()\n");
  auto frames = collector.Wait(3, absl::Seconds(5));
  REQUIRE(frames.size() == 3);
  REQUIRE(frames[0].error.type_module == "builtins");
  REQUIRE(frames[0].error.type_qualname == "KeyError");
  REQUIRE(frames[0].error.state == "\x80\x04state");
  // Over the bound: dropped, the error itself still sent.
  REQUIRE(frames[1].call_id == "b");
  REQUIRE(frames[1].error.message == "big");
  REQUIRE(frames[1].error.state.empty());
  REQUIRE(frames[2].error.type_module == "mod");
  REQUIRE(frames[2].error.state.empty());
}

TEST_CASE("Sends are queued until flush", "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  Py("ch.send_ready(42, '3.11.2')\n"
     "ch.send_result('a', 1, b'value')\n"
     "ch.send_error('b', 2, 'ValueError', 'bad', 'Traceback...', False)\n");
  REQUIRE(PyEval("ch.pending_bytes() > 0") == "True");
  REQUIRE(collector.Wait(1, absl::Milliseconds(100)).empty());
  Py("ch.flush()\n");
  REQUIRE(PyEval("ch.pending_bytes()") == "0");
  auto frames = collector.Wait(3, absl::Seconds(5));
  REQUIRE(frames.size() == 3);
  REQUIRE(frames[0].type == ipc::FrameType::kReady);
  REQUIRE(frames[0].pid == 42);
  REQUIRE(frames[0].detail == "3.11.2");
  REQUIRE(frames[1].type == ipc::FrameType::kResult);
  REQUIRE(frames[1].call_id == "a");
  REQUIRE(frames[1].encoding == 1);
  REQUIRE(frames[1].data == "value");
  REQUIRE(frames[1].total_size == 5);
  REQUIRE(frames[2].type == ipc::FrameType::kError);
  REQUIRE(frames[2].error.code == 2);
  REQUIRE(frames[2].error.type == "ValueError");
  REQUIRE(frames[2].error.message == "bad");
  REQUIRE(frames[2].error.traceback == "Traceback...");
  REQUIRE_FALSE(frames[2].error.cancelled);
}

TEST_CASE("send_item queues one stream_item frame", "[channel]") {
  Pair pair;
  FrameCollector collector(pair.peer);
  Py("ch.send_item('s', 0, 1, b'first')\n"
     "ch.send_item('s', 1, 2, memoryview(b'\\x01'))\n"
     "ch.flush()\n");
  auto frames = collector.Wait(2, absl::Seconds(5));
  REQUIRE(frames.size() == 2);
  for (size_t i = 0; i < frames.size(); ++i) {
    REQUIRE(frames[i].type == ipc::FrameType::kStreamItem);
    REQUIRE(frames[i].call_id == "s");
    REQUIRE(frames[i].index == i);
  }
  REQUIRE(frames[0].encoding == 1);
  REQUIRE(frames[0].data == "first");
  REQUIRE(frames[1].encoding == 2);
  REQUIRE(frames[1].data == "\x01");

  // A large item is written whole, without chunking.
  Py("ch.send_item('s', 2, 1, bytes(3 * w.CHUNK_BYTES))\n"
     "ch.flush()\n");
  frames = collector.Wait(3, absl::Seconds(10));
  REQUIRE(frames.size() == 3);
  REQUIRE(frames[2].index == 2);
  REQUIRE(frames[2].data == std::string(3 * ipc::kChunkBytes, '\0'));

  // Over the frame limit: ValueError, nothing queued, the channel usable.
  // bytes(n) is calloc'd, so the refused item costs no memory.
  REQUIRE(Raised("ch.send_item('s', 3, 1, bytes(256 * 1024 * 1024 + 1))",
                 "ValueError")
              .find("exceeds") != std::string::npos);
  REQUIRE(PyEval("ch.pending_bytes()") == "0");
  REQUIRE(Raised("ch.send_item('s', -1, 1, b'')", "ValueError") != kNoError);
}

TEST_CASE("Large results are cut into result_chunk frames", "[channel]") {
  constexpr size_t kChunk = ipc::kChunkBytes;
  const size_t size = GENERATE(size_t{0}, ipc::kChunkBytes - 1,
                               ipc::kChunkBytes, ipc::kChunkBytes + 1,
                               2 * ipc::kChunkBytes, 3 * ipc::kChunkBytes + 5);
  CAPTURE(size);
  Pair pair;
  FrameCollector collector(pair.peer);
  Py(absl::StrCat("data = bytes(i % 251 for i in range(", size, "))\n",
                  "ch.send_result('big', 1, memoryview(data))\n"
                  "ch.flush()\n"));
  const size_t want_chunks = size <= kChunk ? 0 : (size - 1) / kChunk;
  auto frames = collector.Wait(want_chunks + 1, absl::Seconds(20));
  REQUIRE(frames.size() == want_chunks + 1);
  std::string joined;
  for (size_t i = 0; i < frames.size(); ++i) {
    const bool last = i + 1 == frames.size();
    REQUIRE(frames[i].call_id == "big");
    REQUIRE(frames[i].type ==
            (last ? ipc::FrameType::kResult : ipc::FrameType::kResultChunk));
    if (!last) REQUIRE(frames[i].data.size() == kChunk);
    REQUIRE(frames[i].data.size() <= kChunk);
    joined += frames[i].data;
  }
  REQUIRE(frames.back().total_size == size);
  REQUIRE(joined.size() == size);
  for (size_t i = 0; i < size; i += 4099) {
    REQUIRE(static_cast<unsigned char>(joined[i]) == i % 251);
  }
}

TEST_CASE("A result given as a list of parts is their concatenation",
          "[channel]") {
  const size_t size = GENERATE(size_t{3}, 300 * 1024, 2 * ipc::kChunkBytes + 7);
  CAPTURE(size);
  Pair pair;
  FrameCollector collector(pair.peer);
  Py(absl::StrCat("data = bytes(i % 251 for i in range(", size, "))\n",
                  "ch.send_result('p', 1, [data[:1], bytearray(data[1:2]), "
                  "memoryview(data)[2:]])\n"
                  "ch.flush()\n"));
  const size_t want = size <= ipc::kChunkBytes ? 1 : 3;
  auto frames = collector.Wait(want, absl::Seconds(20));
  REQUIRE(frames.size() == want);
  std::string joined;
  for (const ipc::Frame& f : frames) joined += f.data;
  REQUIRE(frames.back().total_size == size);
  REQUIRE(joined.size() == size);
  for (size_t i = 0; i < size; i += 997) {
    REQUIRE(static_cast<unsigned char>(joined[i]) == i % 251);
  }
  Py("try:\n"
     "    ch.send_result('p', 1, [b'ok', 5])\n"
     "    outcome = 'no error'\n"
     "except TypeError:\n"
     "    outcome = 'TypeError'\n"
     "del data\n");
  REQUIRE(PyEval("outcome") == "TypeError");
}

TEST_CASE("Large results go through the payload ring while it has room",
          "[channel][ring]") {
  constexpr size_t kChunk = ipc::kChunkBytes;
  RingPair pair(2 * kChunk);
  FrameCollector collector(pair.peer);
  const size_t size = 3 * kChunk + 70 * 1024;
  // As a list of parts (a pickle written in pieces), cut across them.
  Py(absl::StrCat("data = bytes(i % 239 for i in range(", size, "))\n",
                  "ch.send_result('big', 1, [data[:5], memoryview(data)[5:",
                  kChunk + 9, "], b'', data[", kChunk + 9,
                  ":]])\n"
                  "ch.flush()\n"));
  auto frames = collector.Wait(4, absl::Seconds(20));
  REQUIRE(frames.size() == 4);
  std::string joined;
  size_t in_ring = 0;
  for (ipc::Frame& f : frames) {
    if (f.in_ring) {
      ++in_ring;
      auto piece = pair.daemon->Get(f.ring_pos, f.ring_size);
      REQUIRE(piece.ok());
      joined.append(*piece);
      pair.daemon->Release(f.ring_pos + f.ring_size);
    } else {
      joined += f.data;
    }
  }
  // The collector releases only after all were sent: two chunks fit.
  CHECK(in_ring == 2);
  REQUIRE(frames.back().type == ipc::FrameType::kResult);
  REQUIRE(frames.back().total_size == size);
  REQUIRE(joined.size() == size);
  for (size_t i = 0; i < size; i += 4093) {
    REQUIRE(static_cast<unsigned char>(joined[i]) == i % 239);
  }
  Py("del data\n");
}

TEST_CASE(
    "Large results are written unchanged on the wire, after logs and "
    "queued frames",
    "[channel]") {
  constexpr size_t kChunk = ipc::kChunkBytes;
  const size_t size =
      GENERATE(size_t{300 * 1024}, ipc::kChunkBytes, ipc::kChunkBytes + 1,
               3 * ipc::kChunkBytes, 3 * ipc::kChunkBytes + 5);
  CAPTURE(size);
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>(i % 251);
  // What the channel sent before it stopped copying: a small result queued
  // first, AppendFrame-encoded chunk frames, the final result frame.
  ipc::Frame small;
  small.type = ipc::FrameType::kResult;
  small.call_id = "small";
  small.encoding = 2;
  small.data = "tiny";
  small.total_size = 4;
  std::string want;
  REQUIRE_OK(ipc::AppendFrame(small, want));
  size_t last =
      size <= kChunk ? size : (size % kChunk ? size % kChunk : kChunk);
  size_t offset = 0;
  for (; size - offset > last; offset += kChunk) {
    ipc::Frame chunk = ChunkFrame("big", data.substr(offset, kChunk));
    chunk.type = ipc::FrameType::kResultChunk;
    REQUIRE_OK(ipc::AppendFrame(chunk, want));
  }
  ipc::Frame result;
  result.type = ipc::FrameType::kResult;
  result.call_id = "big";
  result.encoding = 1;
  result.data = data.substr(offset);
  result.total_size = size;
  REQUIRE_OK(ipc::AppendFrame(result, want));

  Pair pair;
  std::string got;
  std::thread reader([&] { got = ReadUntilEnd(pair.peer, want); });
  Py(absl::StrCat(
      "data = bytearray(i % 251 for i in range(", size, "))\n",
      "ch.send_result('small', 2, b'tiny')\n"
      "ch.send_log(logger='lg', message='before', call_id='big')\n"
      "ch.send_result('big', 1, memoryview(data))\n"
      "ch.flush()\n"
      "data[:] = b''  # the buffer is released again: resizing works\n"));
  reader.join();
  // The log record (queued before) comes first, then `want` unchanged.
  ipc::FrameReader frames;
  frames.Append(got.data(), got.size());
  auto log = frames.Next();
  REQUIRE(log.ok());
  REQUIRE(log->has_value());
  REQUIRE((*log)->type == ipc::FrameType::kLog);
  runtime::v1::LogRecord record;
  REQUIRE(record.ParseFromString((*log)->record));
  REQUIRE(record.message() == "before");
  REQUIRE(frames.buffered() == want.size());
  REQUIRE(got.substr(got.size() - want.size()) == want);
}

TEST_CASE("A write to a closed peer raises ChannelError", "[channel]") {
  Pair pair;
  close(pair.peer);
  pair.peer = -1;
  Py("ch.send_result('a', 1, b'x')\n"
     "try:\n"
     "    ch.flush()\n"
     "    outcome = 'no error'\n"
     "except w.ChannelError as e:\n"
     "    outcome = str(e)\n");
  REQUIRE(PyEval("outcome").find("Broken pipe") != std::string::npos);
}

TEST_CASE("Bad arguments raise TypeError, not crashes", "[channel]") {
  Pair pair;
  Py("errors = []\n"
     "for f, a in [(ch.send_result, ('a', 1)),\n"
     "             (ch.send_result, (1, 1, b'')),\n"
     "             (ch.send_result, ('a', 1, 'not bytes')),\n"
     "             (ch.send_error, ('a', 'x', 't', 'm', 'tb', False)),\n"
     "             (ch.send_item, ('a', 0, 1)),\n"
     "             (ch.send_item, ('a', 0, 1, 'not bytes')),\n"
     "             (ch.send_ready, (1,))]:\n"
     "    try:\n"
     "        f(*a)\n"
     "    except TypeError:\n"
     "        errors.append('TypeError')\n");
  REQUIRE(PyEval("errors == ['TypeError'] * 7") == "True");
  REQUIRE(PyEval("ch.pending_bytes()") == "0");
}

}  // namespace
}  // namespace agentix::worker
