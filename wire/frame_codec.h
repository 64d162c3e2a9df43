// The frame wire's encoding (docs/FRAME-WIRE.md): the Calls stream over a
// plain Unix socket as 5-byte-header frames. Pure functions over bytes, no
// I/O, so that the decoders can be fuzzed and tested alone.
//
//   u32le N (payload bytes) | u8 kind | N bytes payload
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace agentix::sandbox {

inline constexpr size_t kFrameHeaderBytes = 5;

enum class FrameKind : uint8_t {
  kHello = 1,      // host -> daemon, first frame, once: metadata pairs (and
                   // daemon -> host only when asked: kFrameCallsCpuFollowKey)
  kMessage = 2,    // a serialized CallsRequest / CallsResponse
  kHalfClose = 3,  // host -> daemon, empty: the host's writes_done
  kStatus = 4,     // daemon -> host, last frame: u32le code, UTF-8 details
  // Both ways, on a connection with a payload ring: a MESSAGE whose bulk
  // bytes lie in the sender's ring (RingMessage below).
  kRingMessage = 5,
};

// Largest MESSAGE payload accepted from a host: the 4 MiB a gRPC client
// sends by default plus room for framing, as the spec fixes it.
inline constexpr size_t kMaxFrameMessageBytes = (4u << 20) + (64u << 10);
// Largest HELLO payload: metadata, as gRPC's default 16 KiB header limit
// with room to spare; a token and a client id are a few hundred bytes.
inline constexpr size_t kMaxHelloBytes = 64u << 10;
// Largest STATUS payload the decoder accepts (the daemon's details are
// short).
inline constexpr size_t kMaxStatusBytes = 64u << 10;

// Writes the header of a frame of `kind` carrying `payload_bytes`.
void EncodeFrameHeader(FrameKind kind, uint32_t payload_bytes,
                       char out[kFrameHeaderBytes]);
// A whole frame: header then payload.
std::string EncodeFrame(FrameKind kind, absl::string_view payload);

struct FrameView {
  FrameKind kind;
  absl::string_view payload;  // points into the parsed buffer
  size_t frame_bytes;         // header + payload: what to consume
};

// Parses the frame at the start of `buffer` (bytes read from a host).
// Returns the frame when it is whole; FrameView{.frame_bytes = 0} when more
// bytes are needed; InvalidArgument for an unknown kind, a payload over its
// kind's limit (MESSAGE kMaxFrameMessageBytes, HELLO kMaxHelloBytes, STATUS
// kMaxStatusBytes) or a non-empty HALF_CLOSE. Decided from the header alone,
// so a hostile length never makes the caller wait for or buffer its bytes.
absl::StatusOr<FrameView> ParseFrame(absl::string_view buffer);

// The HELLO key naming the RuntimeService stream a connection carries, and
// its values (absent: Calls); another value is answered STATUS 12.
inline constexpr char kFrameStreamKey[] = "agentix-stream";
inline constexpr char kFrameStreamCalls[] = "calls";
inline constexpr char kFrameStreamNamespace[] = "namespace";

// HELLO key: the memfd sent with HELLO (SCM_RIGHTS) is the connection's
// payload ring (worker/ipc/payload_area.h; the host created it). The daemon
// answers with an empty RING_MESSAGE once it has mapped it.
inline constexpr char kFramePayloadRingKey[] = "agentix-payload-ring";
// HELLO key of a Calls connection whose host pins its own waits to this CPU
// (decimal): the daemon's call path uses it too if it may run there
// (sandbox/calls_cpu.h, CallsCpu::PreferCpu; docs/FRAME-WIRE.md, "Wake-ups").
inline constexpr char kFrameCallsCpuKey[] = "agentix-calls-cpu";
// HELLO key of a Calls connection whose host pins its waits by default and
// follows the daemon's choice: a daemon run with --calls_cpu=probe answers,
// once its probe has chosen, with a HELLO frame of its own holding
// agentix-calls-cpu "wait" (keep pinning) or "off" (do not pin). Value "1"
// (stop 31's hosts): that first answer only; kFrameCallsCpuFollowChanges:
// also each later change of it (a re-probe's). Other daemons send nothing;
// a host that does not ask is sent nothing.
inline constexpr char kFrameCallsCpuFollowKey[] = "agentix-calls-cpu-follow";
inline constexpr char kFrameCallsCpuFollowChanges[] = "2";

// RING_MESSAGE's payload: `u16le count`, then `count` pieces of
// `u32le at, u64le pos, u64le size`, then the message's bytes with each
// piece's bytes left out. The message is those bytes with the `size` bytes
// at `pos` in the sender's ring put back at offset `at` of them (offsets
// into the bytes that are there, non-decreasing).
struct RingPieceRef {
  uint32_t at = 0;
  uint64_t pos = 0;
  uint64_t size = 0;
};
struct RingMessage {
  std::vector<RingPieceRef> pieces;
  absl::string_view bytes;  // the message without its pieces
};
inline constexpr size_t kMaxRingPieces = 64;
inline constexpr size_t kRingPieceRefBytes = 20;
// The payload's head (`count` and the pieces), to be followed by the bytes.
std::string EncodeRingHead(const std::vector<RingPieceRef>& pieces);
// InvalidArgument for a truncated head, more than kMaxRingPieces pieces,
// offsets past the bytes or decreasing, an empty piece, or a whole message
// longer than `max_message_bytes`.
absl::StatusOr<RingMessage> DecodeRingMessage(absl::string_view payload,
                                              size_t max_message_bytes);

// HELLO's payload: `u16le key_len, key, u32le value_len, value`, repeated.
using FrameMetadata = std::vector<std::pair<std::string, std::string>>;
std::string EncodeHello(const FrameMetadata& metadata);
// InvalidArgument for a truncated pair, an empty key or one that is not
// lowercase ASCII (letters, digits, '-', '_', '.'), as gRPC metadata keys.
absl::StatusOr<FrameMetadata> DecodeHello(absl::string_view payload);
// The value of `key` (the first one), or null.
const std::string* FindMetadata(const FrameMetadata& metadata,
                                absl::string_view key);

// STATUS's payload: u32le gRPC status code, then UTF-8 details.
std::string EncodeStatus(absl::StatusCode code, absl::string_view details);
struct FrameStatus {
  uint32_t code = 0;
  std::string details;
};
// InvalidArgument when shorter than the code.
absl::StatusOr<FrameStatus> DecodeStatus(absl::string_view payload);

}  // namespace agentix::sandbox
