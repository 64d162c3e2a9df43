#include "wire/frame_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace agentix::sandbox {
namespace {

uint32_t ReadU32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return uint32_t{u[0]} | uint32_t{u[1]} << 8 | uint32_t{u[2]} << 16 |
         uint32_t{u[3]} << 24;
}
uint16_t ReadU16(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint16_t>(u[0] | u[1] << 8);
}
void AppendU32(std::string& out, uint32_t v) {
  char b[4] = {static_cast<char>(v), static_cast<char>(v >> 8),
               static_cast<char>(v >> 16), static_cast<char>(v >> 24)};
  out.append(b, 4);
}
void AppendU16(std::string& out, uint16_t v) {
  char b[2] = {static_cast<char>(v), static_cast<char>(v >> 8)};
  out.append(b, 2);
}

bool ValidKey(absl::string_view key) {
  if (key.empty()) return false;
  for (char c : key) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
          c == '_' || c == '.')) {
      return false;
    }
  }
  return true;
}

}  // namespace

void EncodeFrameHeader(FrameKind kind, uint32_t payload_bytes,
                       char out[kFrameHeaderBytes]) {
  out[0] = static_cast<char>(payload_bytes);
  out[1] = static_cast<char>(payload_bytes >> 8);
  out[2] = static_cast<char>(payload_bytes >> 16);
  out[3] = static_cast<char>(payload_bytes >> 24);
  out[4] = static_cast<char>(kind);
}

std::string EncodeFrame(FrameKind kind, absl::string_view payload) {
  std::string out(kFrameHeaderBytes, '\0');
  EncodeFrameHeader(kind, static_cast<uint32_t>(payload.size()), out.data());
  out.append(payload.data(), payload.size());
  return out;
}

absl::StatusOr<FrameView> ParseFrame(absl::string_view buffer) {
  if (buffer.size() < kFrameHeaderBytes) {
    return FrameView{FrameKind::kMessage, {}, 0};
  }
  const uint32_t length = ReadU32(buffer.data());
  const uint8_t kind = static_cast<uint8_t>(buffer[4]);
  size_t limit = 0;
  switch (static_cast<FrameKind>(kind)) {
    case FrameKind::kHello: limit = kMaxHelloBytes; break;
    case FrameKind::kMessage: limit = kMaxFrameMessageBytes; break;
    case FrameKind::kHalfClose: limit = 0; break;
    case FrameKind::kStatus: limit = kMaxStatusBytes; break;
    case FrameKind::kRingMessage: limit = kMaxFrameMessageBytes; break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown frame kind ", kind));
  }
  if (length > limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame of kind ", kind, " carries ", length,
        " bytes; at most ", limit, " are allowed"));
  }
  if (buffer.size() - kFrameHeaderBytes < length) {
    return FrameView{FrameKind::kMessage, {}, 0};
  }
  return FrameView{static_cast<FrameKind>(kind),
                   buffer.substr(kFrameHeaderBytes, length),
                   kFrameHeaderBytes + length};
}

std::string EncodeRingHead(const std::vector<RingPieceRef>& pieces) {
  std::string out;
  AppendU16(out, static_cast<uint16_t>(pieces.size()));
  for (const RingPieceRef& piece : pieces) {
    AppendU32(out, piece.at);
    AppendU32(out, static_cast<uint32_t>(piece.pos));
    AppendU32(out, static_cast<uint32_t>(piece.pos >> 32));
    AppendU32(out, static_cast<uint32_t>(piece.size));
    AppendU32(out, static_cast<uint32_t>(piece.size >> 32));
  }
  return out;
}

absl::StatusOr<RingMessage> DecodeRingMessage(absl::string_view payload,
                                              size_t max_message_bytes) {
  if (payload.size() < 2) {
    return absl::InvalidArgumentError("RING_MESSAGE shorter than its count");
  }
  const size_t count = static_cast<uint8_t>(payload[0]) |
                       size_t{static_cast<uint8_t>(payload[1])} << 8;
  if (count > kMaxRingPieces) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RING_MESSAGE with ", count, " ring pieces; at most ", kMaxRingPieces));
  }
  const size_t head = 2 + count * kRingPieceRefBytes;
  if (payload.size() < head) {
    return absl::InvalidArgumentError(
        "RING_MESSAGE shorter than its piece list");
  }
  RingMessage out;
  out.bytes = payload.substr(head);
  uint64_t total = out.bytes.size();
  const char* p = payload.data() + 2;
  for (size_t i = 0; i < count; ++i, p += kRingPieceRefBytes) {
    RingPieceRef piece;
    piece.at = ReadU32(p);
    piece.pos = ReadU32(p + 4) | uint64_t{ReadU32(p + 8)} << 32;
    piece.size = ReadU32(p + 12) | uint64_t{ReadU32(p + 16)} << 32;
    if (piece.at > out.bytes.size() ||
        (!out.pieces.empty() && piece.at < out.pieces.back().at)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RING_MESSAGE piece ", i, " goes at offset ", piece.at,
          ": past the message's ", out.bytes.size(),
          " bytes or before the previous piece"));
    }
    if (piece.size == 0 || piece.size > max_message_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RING_MESSAGE piece ", i, " has ", piece.size, " bytes"));
    }
    total += piece.size;
    out.pieces.push_back(piece);
  }
  if (total > max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RING_MESSAGE carries a message of ", total, " bytes; at most ",
        max_message_bytes, " are allowed"));
  }
  return out;
}

std::string EncodeHello(const FrameMetadata& metadata) {
  std::string out;
  for (const auto& [key, value] : metadata) {
    AppendU16(out, static_cast<uint16_t>(key.size()));
    out += key;
    AppendU32(out, static_cast<uint32_t>(value.size()));
    out += value;
  }
  return out;
}

absl::StatusOr<FrameMetadata> DecodeHello(absl::string_view payload) {
  FrameMetadata metadata;
  size_t at = 0;
  while (at < payload.size()) {
    if (payload.size() - at < 2) {
      return absl::InvalidArgumentError("HELLO: truncated key length");
    }
    const size_t key_len = ReadU16(payload.data() + at);
    at += 2;
    if (payload.size() - at < key_len) {
      return absl::InvalidArgumentError("HELLO: truncated key");
    }
    absl::string_view key = payload.substr(at, key_len);
    at += key_len;
    if (!ValidKey(key)) {
      return absl::InvalidArgumentError(
          "HELLO: a metadata key must be non-empty lowercase ASCII "
          "(a-z, 0-9, '-', '_', '.')");
    }
    if (payload.size() - at < 4) {
      return absl::InvalidArgumentError("HELLO: truncated value length");
    }
    const size_t value_len = ReadU32(payload.data() + at);
    at += 4;
    if (payload.size() - at < value_len) {
      return absl::InvalidArgumentError("HELLO: truncated value");
    }
    metadata.emplace_back(std::string(key),
                          std::string(payload.substr(at, value_len)));
    at += value_len;
  }
  return metadata;
}

const std::string* FindMetadata(const FrameMetadata& metadata,
                                absl::string_view key) {
  for (const auto& [k, v] : metadata) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::string EncodeStatus(absl::StatusCode code, absl::string_view details) {
  std::string out;
  AppendU32(out, static_cast<uint32_t>(code));
  out.append(details.data(), details.size());
  return out;
}

absl::StatusOr<FrameStatus> DecodeStatus(absl::string_view payload) {
  if (payload.size() < 4) {
    return absl::InvalidArgumentError("STATUS: shorter than its code");
  }
  return FrameStatus{ReadU32(payload.data()), std::string(payload.substr(4))};
}

}  // namespace agentix::sandbox
