#include "wire/frame_splice.h"

#include <catch2/catch.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "wire/frame_codec.h"
#include "wire/splice_test_util.h"
#include "wire/wire_limits.h"
#include "worker/ipc/payload_area.h"

namespace agentix::sandbox {
namespace {

using runtime::v1::CallsRequest;
using runtime::v1::CallsResponse;
using runtime::v1::HostEvent;
using runtime::v1::SandboxEvent;

// Parses `bytes` both ways; returns how many events were spliced.
size_t CheckSameAsProtobuf(const std::string& bytes) {
  CallsRequest expected;
  const bool protobuf_ok =
      expected.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  SplicedRequest parsed;
  const bool ok = ParseCallsRequestSpliced(bytes, parsed);
  REQUIRE(ok == protobuf_ok);
  if (!ok) return 0;
  CHECK(Rebuilt(parsed).SerializeAsString() == expected.SerializeAsString());
  size_t spliced = 0;
  for (const auto& bulk : parsed.bulk) {
    if (!bulk) continue;
    ++spliced;
    // A view of the input: the bytes were not copied.
    CHECK(bulk->data() >= bytes.data());
    CHECK(bulk->data() + bulk->size() <= bytes.data() + bytes.size());
    CHECK(bulk->size() >= kSpliceMinBytes);
  }
  return spliced;
}

std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}

std::string Len(uint32_t field, const std::string& payload) {
  return std::string(1, static_cast<char>(field << 3 | 2)) +
         Varint(payload.size()) + payload;
}

TEST_CASE("large arguments are left in the frame, the rest parsed as protobuf") {
  CallsRequest request;
  auto* start = request.add_events()->mutable_start();
  start->set_call_id("c1");
  start->set_callable("mod::fn");
  start->set_arguments(Bytes(1 << 20, 'a'));
  start->set_arguments_size(3 << 20);
  start->set_context("ctx");
  start->set_stream_window(4);
  start->set_traceparent("00-0123456789abcdef0123456789abcdef-0123456789abcdef-01");
  (*start->mutable_baggage())["k"] = "v";
  auto* chunk = request.add_events()->mutable_argument_chunk();
  chunk->set_call_id("c1");
  chunk->set_data(Bytes(1 << 20, 'b'));
  chunk->set_offset(1 << 20);
  auto* unset_offset = request.add_events()->mutable_argument_chunk();
  unset_offset->set_call_id("c1");
  unset_offset->set_data(Bytes(kSpliceMinBytes, 'c'));
  request.add_events()->mutable_ack()->set_call_id("old");
  auto* small = request.add_events()->mutable_argument_chunk();
  small->set_call_id("c2");
  small->set_data(Bytes(kSpliceMinBytes - 1, 'd'));
  request.add_events()->mutable_cancel()->set_call_id("c3");
  CHECK(CheckSameAsProtobuf(request.SerializeAsString()) == 3);
}

TEST_CASE("small messages and messages without bulk fields go through protobuf") {
  CallsRequest request;
  auto* start = request.add_events()->mutable_start();
  start->set_call_id("c1");
  start->set_arguments(Bytes(1000, 'a'));
  CHECK(CheckSameAsProtobuf(request.SerializeAsString()) == 0);
  for (int i = 0; i < 3000; ++i) {
    request.add_events()->mutable_ack()->set_call_id(std::string(30, 'x'));
  }
  CHECK(CheckSameAsProtobuf(request.SerializeAsString()) == 0);
  CHECK(CheckSameAsProtobuf("") == 0);
}

TEST_CASE("unusual encodings are parsed exactly as protobuf parses them") {
  const std::string big = Bytes(200 << 10, 'z');
  const std::string other = Bytes(100 << 10, 'y');
  auto request_of = [](const std::string& host_event) {
    return Len(1, host_event);
  };
  // data before call_id; an unknown field after it: spliced, both kept.
  CHECK(CheckSameAsProtobuf(request_of(Len(
            2, Len(2, big) + Len(1, "id") + "\xF8\x06\x05")))  // field 111 varint
        == 1);
  // the data field twice (protobuf keeps the last): not spliced, same result.
  CHECK(CheckSameAsProtobuf(request_of(Len(2, Len(1, "id") + Len(2, big) +
                                                  Len(2, other)))) == 0);
  // field 2 with a varint wire type (an unknown field to protobuf) and once
  // as bytes.
  CHECK(CheckSameAsProtobuf(request_of(
            Len(2, std::string("\x10\x05", 2) + Len(2, big)))) == 0);
  // a HostEvent holding start and then argument_chunk (the oneof's last wins).
  CHECK(CheckSameAsProtobuf(request_of(
            Len(1, Len(1, "s") + Len(4, big)) + Len(2, Len(1, "a") + Len(2, other)))) ==
        0);
  // StartCall's arguments among its other fields.
  CHECK(CheckSameAsProtobuf(request_of(Len(
            1, Len(1, "s") + Len(2, "m::f") + Len(4, big) +
                   std::string("\x28\x80\x80\x40", 4) + Len(6, "ctx")))) == 1);
  // an unknown top-level field: protobuf parses the whole message.
  CHECK(CheckSameAsProtobuf(request_of(Len(2, Len(1, "id") + Len(2, big))) +
                            Len(9, "x")) == 0);
}

TEST_CASE("tags and lengths longer than protobuf reads are refused as it refuses them") {
  const std::string big = Bytes(200 << 10, 'z');
  const std::string chunk = Len(1, "id") + Len(2, big);
  // The events tag in six bytes (0x8A 0x80 0x80 0x80 0x80 0x00 is still 10).
  CheckSameAsProtobuf(std::string("\x8a\x80\x80\x80\x80\x00", 6) +
                      Varint(chunk.size() + 4) + Len(2, chunk));
  // The data field's length in six bytes.
  std::string padded_length = Varint(big.size());
  padded_length[padded_length.size() - 1] |= '\x80';
  const std::string odd_chunk =
      Len(1, "id") + "\x12" + padded_length + std::string("\x80\x80\x80\x00", 4) + big;
  CheckSameAsProtobuf(Len(1, Len(2, odd_chunk)));
  // The HostEvent's tag in five bytes: protobuf accepts it, and so do we.
  CHECK(CheckSameAsProtobuf(Len(1, std::string("\x92\x80\x80\x80\x00", 5) +
                                       Varint(chunk.size()) + chunk)) == 1);
}

TEST_CASE("messages protobuf refuses are refused") {
  const std::string big = Bytes(200 << 10, 'z');
  std::string good = Len(1, Len(2, Len(1, "id") + Len(2, big)));
  CheckSameAsProtobuf(good.substr(0, good.size() - 1));  // truncated
  // a call_id that is not UTF-8 (proto3 strings must be)
  CheckSameAsProtobuf(Len(1, Len(2, Len(1, "\xff\xfe") + Len(2, big))));
  // a length running past its message
  std::string inner = Len(1, "id") + Len(2, big);
  inner[inner.size() - big.size() - 1] = '\x7f';
  CheckSameAsProtobuf(Len(1, Len(2, inner)));
  SplicedRequest parsed;
  CHECK_FALSE(ParseCallsRequestSpliced(
      Len(1, Len(2, Len(1, "\xff\xfe") + Len(2, big))), parsed));
  CHECK(parsed.request.events_size() == 0);
  CHECK(parsed.bulk.empty());
}

// What the frame wire wrote before splicing: protobuf's serialization of
// each batch in a MESSAGE frame.
std::string Serialized(const std::vector<SandboxEventPtr>& events) {
  std::string out;
  CallsResponse batch;
  size_t bytes = 0;
  auto flush = [&] {
    if (batch.events_size() == 0) return;
    out += EncodeFrame(FrameKind::kMessage, batch.SerializeAsString());
    batch.Clear();
    bytes = 0;
  };
  for (const auto& event : events) {
    const size_t framed = FramedItemBytes(event->ByteSizeLong());
    if (batch.events_size() > 0 && bytes + framed > kMaxBatchBytes) flush();
    *batch.add_events() = *event;
    bytes += framed;
  }
  flush();
  return out;
}

SandboxEventPtr Chunk(const std::string& id, std::string data) {
  auto event = std::make_shared<SandboxEvent>();
  event->mutable_result_chunk()->set_call_id(id);
  event->mutable_result_chunk()->set_data(std::move(data));
  return event;
}

SandboxEventPtr Result(const std::string& id, std::string value) {
  auto event = std::make_shared<SandboxEvent>();
  event->mutable_result()->set_call_id(id);
  event->mutable_result()->set_value(std::move(value));
  event->mutable_result()->set_value_size(12345);
  event->mutable_result()->set_log_seq(7);
  return event;
}

SandboxEventPtr Item(const std::string& id, std::string value) {
  auto event = std::make_shared<SandboxEvent>();
  auto* item = event->mutable_stream_item();
  item->set_call_id(id);
  item->set_index(3);
  item->set_encoding(runtime::v1::ENCODING_PICKLE);
  item->set_value(std::move(value));
  item->set_trace_seq(9);
  return event;
}

// The bytes of `event` that AppendMessagePieces may leave in place.
const std::string& BulkOf(const SandboxEvent& event) {
  if (event.has_result_chunk()) return event.result_chunk().data();
  if (event.has_result()) return event.result().value();
  return event.stream_item().value();
}

TEST_CASE("large results and chunks are written from the events, the same bytes as protobuf's") {
  std::vector<SandboxEventPtr> events = {
      Result("small", "v"),
      Chunk("c1", Bytes(1 << 20, 'a')),
      Chunk("c1", Bytes(1 << 20, 'b')),
      Chunk("", Bytes(kSpliceMinBytes, 'c')),  // no call_id field
      Chunk("c1", Bytes(kSpliceMinBytes - 1, 'd')),  // small: serialized
      Chunk("c1", Bytes(1 << 20, 'e')),
      Chunk("c1", Bytes(1 << 20, 'f')),  // the batch passes 4 MiB here
      Chunk("c1", ""),
      Result("c1", Bytes(1 << 20, 'g')),  // spliced, then its tail fields
      Item("s", Bytes(kSpliceMinBytes, 'h')),
      Item("s", Bytes(100, 'i')),
      Result("r", Bytes(200 << 10, 'j')),  // the batch's last piece is a tail
  };
  std::deque<OutPiece> pieces;
  AppendMessagePieces(events, pieces);
  std::string written;
  size_t views = 0;
  std::vector<size_t> frame_ends;
  for (const OutPiece& piece : pieces) {
    written += std::string(piece.bytes());
    if (piece.frame_end()) frame_ends.push_back(written.size());
    for (const auto& event : events) {
      const std::string& data = BulkOf(*event);
      if (!data.empty() && piece.bytes().data() == data.data()) ++views;
    }
  }
  CHECK(written == Serialized(events));
  CHECK(views == 8);  // every value and chunk of kSpliceMinBytes or more
  // frame_end marks exactly the frames' ends.
  std::vector<size_t> expected_ends;
  absl::string_view rest = written;
  size_t at = 0;
  while (!rest.empty()) {
    auto frame = ParseFrame(rest);
    REQUIRE(frame.ok());
    REQUIRE(frame->frame_bytes > 0);
    at += frame->frame_bytes;
    expected_ends.push_back(at);
    rest.remove_prefix(frame->frame_bytes);
  }
  CHECK(frame_ends == expected_ends);
  CHECK(expected_ends.size() == 2);
}

// `message` with each of `bulks` (found by content) left out, as a host
// writes a RING_MESSAGE's bytes; the pieces' offsets into what is left.
struct Cut {
  std::string bytes;
  std::vector<size_t> at;
};
Cut CutOut(const std::string& message, const std::vector<std::string>& bulks) {
  Cut out;
  size_t from = 0;
  for (const std::string& bulk : bulks) {
    const size_t found = message.find(bulk, from);
    REQUIRE(found != std::string::npos);
    out.bytes += message.substr(from, found - from);
    out.at.push_back(out.bytes.size());
    from = found + bulk.size();
  }
  out.bytes += message.substr(from);
  return out;
}

TEST_CASE("ring pieces stand in for bulk fields: the message is protobuf's") {
  CallsRequest request;
  auto* start = request.add_events()->mutable_start();
  start->set_call_id("c1");
  start->set_callable("mod::fn");
  start->set_arguments(Bytes(1 << 20, 'a'));
  start->set_arguments_size(3 << 20);
  start->set_context("ctx");
  request.add_events()->mutable_ack()->set_call_id("old");
  auto* chunk = request.add_events()->mutable_argument_chunk();
  chunk->set_call_id("c1");
  chunk->set_data(Bytes(1 << 20, 'b'));
  chunk->set_offset(1 << 20);
  auto* last = request.add_events()->mutable_argument_chunk();
  last->set_call_id("c1");
  last->set_data(Bytes(kSpliceMinBytes, 'c'));  // offset unset: data ends it
  auto* inline_chunk = request.add_events()->mutable_argument_chunk();
  inline_chunk->set_call_id("c2");
  inline_chunk->set_data(Bytes(kSpliceMinBytes, 'd'));  // stays inline
  const std::string message = request.SerializeAsString();
  // The "ring": the pieces' bytes, elsewhere.
  const std::string ring = start->arguments() + chunk->data() + last->data();
  const Cut cut = CutOut(message, {start->arguments(), chunk->data(), last->data()});
  std::vector<RingPiece> pieces;
  size_t pos = 0;
  for (size_t i = 0; i < cut.at.size(); ++i) {
    const size_t size = i == 0 ? start->arguments().size()
                                : i == 1 ? chunk->data().size()
                                         : last->data().size();
    pieces.push_back({cut.at[i], std::string_view(ring).substr(pos, size)});
    pos += size;
  }
  SplicedRequest parsed;
  REQUIRE(ParseCallsRequestWithRing(cut.bytes, pieces, parsed).ok());
  CHECK(Rebuilt(parsed).SerializeAsString() == message);
  REQUIRE(parsed.bulk.size() == 5);
  // The pieces are the ring's bytes, not copies; the inline one is spliced.
  CHECK(parsed.bulk[0]->data() == ring.data());
  CHECK(!parsed.bulk[1].has_value());
  CHECK(parsed.bulk[2]->data() == ring.data() + (1 << 20));
  CHECK(parsed.bulk[3]->data() == ring.data() + (2 << 20));
  CHECK(parsed.bulk[4]->data() >= cut.bytes.data());
}

TEST_CASE("ring pieces anywhere but at a bulk field are refused, saying so") {
  CallsRequest request;
  auto* chunk = request.add_events()->mutable_argument_chunk();
  chunk->set_call_id("c1");
  chunk->set_data(Bytes(kSpliceMinBytes, 'b'));
  chunk->set_offset(5);
  const std::string message = request.SerializeAsString();
  const std::string data = chunk->data();
  const Cut cut = CutOut(message, {data});
  SplicedRequest parsed;
  auto refused = [&](std::vector<RingPiece> pieces, const std::string& bytes) {
    absl::Status status = ParseCallsRequestWithRing(bytes, pieces, parsed);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(parsed.request.events_size() == 0);
    return std::string(status.message());
  };
  // One byte off either way, or in the call id.
  CHECK(refused({{cut.at[0] - 1, data}}, cut.bytes).find("ring piece") !=
        std::string::npos);
  refused({{cut.at[0] + 1, data}}, cut.bytes);
  refused({{3, data}}, cut.bytes);
  // A size other than the field's length.
  refused({{cut.at[0], std::string_view(data).substr(1)}}, cut.bytes);
  // A piece after the last event.
  refused({{cut.at[0], data}, {cut.bytes.size(), data}}, cut.bytes);
  // The bytes that came are not a CallsRequest of events.
  refused({{cut.at[0], data}}, "\x12\x01x" + cut.bytes);

  // A piece inside an ack, and one standing in for a repeated data field.
  CallsRequest ack;
  ack.add_events()->mutable_ack()->set_call_id(Bytes(kSpliceMinBytes, 'z'));
  const std::string ack_bytes = ack.SerializeAsString();
  const Cut ack_cut = CutOut(ack_bytes, {ack.events(0).ack().call_id()});
  CHECK(refused({{ack_cut.at[0], ack.events(0).ack().call_id()}},
                ack_cut.bytes)
            .find("not exactly one StartCall or ArgumentChunk") !=
        std::string::npos);
  const std::string repeated_inner = Len(1, "c1") + Len(2, data) + Len(2, "x");
  const std::string repeated = Len(1, Len(2, repeated_inner));
  const Cut repeated_cut = CutOut(repeated, {data});
  refused({{repeated_cut.at[0], data}}, repeated_cut.bytes);

  // Without pieces, a RING_MESSAGE's bytes are a CallsRequest as any.
  REQUIRE(ParseCallsRequestWithRing(message, {}, parsed).ok());
  CHECK(Rebuilt(parsed).SerializeAsString() == message);
}

TEST_CASE("a RING_MESSAGE is resolved in the sender's ring: the request, the "
          "end to release, and pieces out of order or released refused") {
  // The host creates the area and puts the bulk bytes in; the daemon maps it.
  auto host = ipc::PayloadArea::Create(2u << 20, /*sealed=*/true);
  REQUIRE(host.ok());
  auto daemon = ipc::PayloadArea::MapSealed((*host)->fd());
  REQUIRE(daemon.ok());
  CallsRequest request;
  for (char fill : {'a', 'b'}) {
    auto* chunk = request.add_events()->mutable_argument_chunk();
    chunk->set_call_id("c1");
    chunk->set_data(Bytes(kSpliceMinBytes, fill));
  }
  const std::string message = request.SerializeAsString();
  const Cut cut = CutOut(message, {request.events(0).argument_chunk().data(),
                                   request.events(1).argument_chunk().data()});
  std::vector<RingPieceRef> refs;
  for (size_t i = 0; i < 2; ++i) {
    const std::string& data =
        request.events(static_cast<int>(i)).argument_chunk().data();
    std::optional<uint64_t> pos = (*host)->Put(data);
    REQUIRE(pos.has_value());
    refs.push_back({static_cast<uint32_t>(cut.at[i]), *pos, data.size()});
  }
  const std::string payload = EncodeRingHead(refs) + cut.bytes;
  std::vector<RingPiece> pieces;
  SplicedRequest parsed;
  absl::StatusOr<uint64_t> end = ParseRingMessage(
      payload, kMaxFrameMessageBytes, **daemon, pieces, parsed);
  REQUIRE(end.ok());
  CHECK(*end == refs[1].pos + refs[1].size);
  CHECK(Rebuilt(parsed).SerializeAsString() == message);
  REQUIRE(pieces.size() == 2);  // views into the ring, not copies
  CHECK(pieces[0].data.data() == parsed.bulk[0]->data());

  auto refused = [&](const std::string& bytes) {
    absl::StatusOr<uint64_t> status = ParseRingMessage(
        bytes, kMaxFrameMessageBytes, **daemon, pieces, parsed);
    CHECK(status.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(status.status().message());
  };
  // The second piece before the first in the ring.
  std::vector<RingPieceRef> swapped = refs;
  std::swap(swapped[0].pos, swapped[1].pos);
  CHECK(refused(EncodeRingHead(swapped) + cut.bytes).find("overlaps") !=
        std::string::npos);
  // A head cut short.
  refused(payload.substr(0, 3));
  // Once released, the same pieces are the ring's no more.
  (*daemon)->Release(*end);
  refused(payload);
}

TEST_CASE("with the host's ring, large results go into it; a full ring "
          "falls back to the socket") {
  // The host creates the area, the daemon maps it (as in the frame wire).
  auto host = ipc::PayloadArea::Create(2u << 20, /*sealed=*/true);
  REQUIRE(host.ok());
  auto daemon = ipc::PayloadArea::MapSealed((*host)->fd());
  REQUIRE(daemon.ok());
  std::vector<SandboxEventPtr> events = {
      Chunk("c1", Bytes(1 << 20, 'a')),
      Chunk("c1", Bytes(1 << 20, 'b')),
      Chunk("c1", Bytes(1 << 20, 'c')),  // the 2 MiB ring is full by now
      Result("c1", Bytes(100, 'g')),
  };
  std::deque<OutPiece> pieces;
  AppendMessagePieces(events, pieces, daemon->get());
  std::string written;
  size_t views = 0;
  for (const OutPiece& piece : pieces) {
    written += std::string(piece.bytes());
    for (const auto& event : events) {
      if (piece.bytes().data() == BulkOf(*event).data()) ++views;
    }
  }
  CHECK(views == 1);  // only the chunk that did not fit
  // Put back together as the host does, the frames are protobuf's.
  std::string rebuilt;
  absl::string_view rest = written;
  size_t ring_frames = 0;
  while (!rest.empty()) {
    auto frame = ParseFrame(rest);
    REQUIRE(frame.ok());
    REQUIRE(frame->frame_bytes > 0);
    if (frame->kind == FrameKind::kRingMessage) {
      ++ring_frames;
      auto message = DecodeRingMessage(frame->payload, kMaxFrameMessageBytes);
      REQUIRE(message.ok());
      std::string whole;
      size_t done = 0;
      for (const RingPieceRef& ref : message->pieces) {
        whole += std::string(message->bytes.substr(done, ref.at - done));
        done = ref.at;
        auto data = (*host)->Get(ref.pos, ref.size);
        REQUIRE(data.ok());
        whole += std::string(*data);
      }
      whole += std::string(message->bytes.substr(done));
      rebuilt += EncodeFrame(FrameKind::kMessage, whole);
    } else {
      rebuilt += std::string(rest.substr(0, frame->frame_bytes));
    }
    rest.remove_prefix(frame->frame_bytes);
  }
  CHECK(ring_frames == 1);
  CHECK(rebuilt == Serialized(events));
}

TEST_CASE("a spliced piece keeps its event alive") {
  std::deque<OutPiece> pieces;
  {
    std::vector<SandboxEventPtr> events = {Chunk("c", Bytes(1 << 20, 'x'))};
    AppendMessagePieces(events, pieces);
  }  // the caller's references are gone (an acknowledged, evicted result)
  REQUIRE(pieces.size() == 2);
  CHECK(pieces[1].bytes() == Bytes(1 << 20, 'x'));
  CHECK(pieces[1].frame_end());
  CHECK_FALSE(pieces[0].frame_end());
}

}  // namespace
}  // namespace agentix::sandbox

namespace agentix::sandbox {
namespace {

// The bytes `queue` would write next, all of them.
std::string Unwritten(const OutQueue& queue) {
  iovec iov[64];
  const size_t count = queue.Gather(iov, 64);
  std::string out;
  for (size_t i = 0; i < count; ++i) {
    out.append(static_cast<const char*>(iov[i].iov_base), iov[i].iov_len);
  }
  REQUIRE(out.size() == queue.bytes());
  return out;
}

// Two frames: "HHH" + a spliced "DDDDDD" (frame 1), then "SS" (frame 2).
OutQueue TwoFrames() {
  OutQueue queue;
  queue.Push(OutPiece("HHH", /*frame_end=*/false));
  queue.Push(OutPiece(Chunk("c", "DDDDDD"), "DDDDDD", /*frame_end=*/true));
  queue.Push(OutPiece("SS", /*frame_end=*/true));
  return queue;
}

TEST_CASE("the out queue writes its pieces in order however sendmsg cuts them") {
  OutQueue queue = TwoFrames();
  CHECK(Unwritten(queue) == "HHHDDDDDDSS");
  queue.Consume(2);
  CHECK(Unwritten(queue) == "HDDDDDDSS");
  queue.Consume(5);
  CHECK(Unwritten(queue) == "DDSS");
  queue.Consume(4);
  CHECK(queue.empty());
  CHECK(queue.bytes() == 0);
}

TEST_CASE("dropping keeps the rest of a frame partly written, so a STATUS "
          "queued next starts a frame") {
  SECTION("only the spliced frame's header piece was written") {
    OutQueue queue = TwoFrames();
    queue.Consume(3);  // exactly the first piece: front_written_ is 0 here
    queue.Drop(/*keep_partial_frame=*/true);
    CHECK(Unwritten(queue) == "DDDDDD");
  }
  SECTION("the frame was cut inside its data") {
    OutQueue queue = TwoFrames();
    queue.Consume(5);
    queue.Drop(true);
    CHECK(Unwritten(queue) == "DDDD");
  }
  SECTION("at a frame boundary nothing is kept") {
    OutQueue queue = TwoFrames();
    queue.Consume(9);
    queue.Drop(true);
    CHECK(queue.empty());
    CHECK(queue.bytes() == 0);
    queue.Push(OutPiece("T", true));
    CHECK(Unwritten(queue) == "T");
  }
  SECTION("nothing written yet: all dropped") {
    OutQueue queue = TwoFrames();
    queue.Drop(true);
    CHECK(queue.empty());
  }
  SECTION("without keeping, everything goes") {
    OutQueue queue = TwoFrames();
    queue.Consume(4);
    queue.Drop(false);
    CHECK(queue.empty());
    CHECK(queue.bytes() == 0);
  }
}

}  // namespace
}  // namespace agentix::sandbox
