// The frame wire's bulk bytes without user-space copies (docs/FRAME-WIRE.md,
// DECISIONS.md "The frame wire's bulk bytes"): a large argument piece is
// taken from the frame where it was read (not parsed into a std::string
// first), and a large result chunk is written to the socket from the
// retained event (not serialized into a frame first). The bytes on the wire
// and what the session manager sees are exactly those of protobuf's parse
// and serialization; only where the bulk bytes live differs.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "wire/sandbox_event.h"

namespace agentix::ipc {
class PayloadArea;
}  // namespace agentix::ipc

namespace agentix::sandbox {

// Smaller bulk fields are copied as protobuf does: splicing pays off only
// for large pieces (the same floor as the payload ring's).
inline constexpr size_t kSpliceMinBytes = 64u << 10;

// A CallsRequest whose large StartCall.arguments / ArgumentChunk.data
// fields stayed in the bytes it was parsed from.
struct SplicedRequest {
  runtime::v1::CallsRequest request;
  // One entry per event of `request`: the bulk field's bytes when they were
  // left out of the message (a view of the parsed bytes, valid as long as
  // they are), else nullopt (the message holds the field, if any).
  std::vector<std::optional<std::string_view>> bulk;
};

// Parses `bytes` into `out` (replacing its contents). True exactly when
// CallsRequest::ParseFromArray accepts `bytes`; the message together with
// `bulk` then carries the same fields. An event is spliced only when it is
// exactly one HostEvent.start / .argument_chunk field whose message holds
// its bulk field (of kSpliceMinBytes or more) once; the rest of that
// message is parsed by protobuf around it. Anything else (other events,
// unknown or repeated fields, malformed input) goes through protobuf whole.
// `min_bytes`: the smallest field spliced (the fuzzer lowers it).
bool ParseCallsRequestSpliced(absl::string_view bytes, SplicedRequest& out,
                              size_t min_bytes = kSpliceMinBytes);

// A ring piece of a RING_MESSAGE (frame_codec.h), its bytes resolved: the
// `data` (a view into the sender's ring) goes at offset `at` of the bytes
// that came on the socket.
struct RingPiece {
  size_t at = 0;
  std::string_view data;
};

// Parses a RING_MESSAGE's `bytes` with `pieces` put back (at non-decreasing
// offsets, as DecodeRingMessage checked) into `out`, whose `bulk` then
// holds each piece. Each piece must be exactly the bulk field
// (StartCall.arguments / ArgumentChunk.data) of an event that is one
// HostEvent.start / .argument_chunk holding that field once, one piece per
// event: the bytes are never joined to be parsed. InvalidArgument saying
// what is wrong otherwise, or when protobuf refuses the rest.
absl::Status ParseCallsRequestWithRing(absl::string_view bytes,
                                       const std::vector<RingPiece>& pieces,
                                       SplicedRequest& out);

// A RING_MESSAGE frame's `payload` (frame_codec.h) parsed into `out`:
// decoded (DecodeRingMessage with `max_message_bytes`), each piece resolved
// in `ring` (the sender's payload ring) into `pieces` (replaced; views into
// the ring), then ParseCallsRequestWithRing. Returns the ring position the
// pieces end at (0: none), to be released once the request's consumer has
// copied what it keeps of them; InvalidArgument saying what is wrong
// otherwise (the head, pieces out of ring order or released already, the
// request itself).
absl::StatusOr<uint64_t> ParseRingMessage(absl::string_view payload,
                                          size_t max_message_bytes,
                                          const ipc::PayloadArea& ring,
                                          std::vector<RingPiece>& pieces,
                                          SplicedRequest& out);

// Bytes queued for a socket: owned, or a view into an event that the piece
// keeps alive (a retained ResultChunk's data).
class OutPiece {
 public:
  explicit OutPiece(std::string owned, bool frame_end)
      : owned_(std::move(owned)), frame_end_(frame_end) {}
  OutPiece(SandboxEventPtr holder, absl::string_view view, bool frame_end)
      : holder_(std::move(holder)), view_(view), frame_end_(frame_end) {}
  absl::string_view bytes() const {
    return holder_ ? view_ : absl::string_view(owned_);
  }
  // The last piece of a frame: the bytes after it start a new frame.
  bool frame_end() const { return frame_end_; }
  void set_frame_end() { frame_end_ = true; }
  // The owned bytes, to be completed before the piece is queued (its
  // frame's header); null for a view.
  std::string* owned() { return holder_ ? nullptr : &owned_; }

 private:
  std::string owned_;
  SandboxEventPtr holder_;
  absl::string_view view_;
  bool frame_end_;
};

// The unwritten bytes of one frame-wire stream, whole frames in pieces,
// written with sendmsg iovecs straight from the pieces. Not thread-safe.
class OutQueue {
 public:
  void Push(OutPiece piece);
  bool empty() const { return pieces_.empty(); }
  // Bytes not yet written.
  size_t bytes() const { return bytes_; }
  // Points up to `max` iovecs at the unwritten bytes, in order; returns how
  // many it filled.
  size_t Gather(iovec* iov, size_t max) const;
  // The first `n` unwritten bytes (at most bytes()) were written.
  void Consume(size_t n);
  // Drops what is unwritten; with `keep_partial_frame`, except the rest of
  // a frame partly written, so that bytes queued next start a frame.
  void Drop(bool keep_partial_frame);

 private:
  std::deque<OutPiece> pieces_;
  size_t front_written_ = 0;  // of pieces_.front()
  // The pieces before pieces_.front() that are written end mid-frame.
  bool mid_frame_ = false;
  size_t bytes_ = 0;
};

// Appends `events` as MESSAGE frames holding CallsResponse messages of at
// most kMaxBatchBytes each (one larger event alone still goes alone), the
// bytes the gRPC Calls stream's batching would produce. A ResultChunk's
// data of kSpliceMinBytes or more is not copied: its piece is a view of the
// event, which the piece keeps alive. With `ring` (the host's payload ring),
// such data is put into the ring instead when it fits, and its frame is a
// RING_MESSAGE saying where.
// Whether AppendMessagePieces would leave bytes of `events` in place (or
// put them in a ring): a result chunk, value or stream item of
// kSpliceMinBytes or more.
bool HasBulk(const std::vector<SandboxEventPtr>& events);

void AppendMessagePieces(const std::vector<SandboxEventPtr>& events,
                         std::deque<OutPiece>& out,
                         ipc::PayloadArea* ring = nullptr);

}  // namespace agentix::sandbox
