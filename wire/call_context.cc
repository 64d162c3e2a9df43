#include "wire/call_context.h"

#include <cstdint>

#include "absl/strings/str_cat.h"

namespace agentix::sandbox {
namespace {

bool LowerHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool AllZero(std::string_view s) {
  return s.find_first_not_of('0') == std::string_view::npos;
}

void PutString(std::string_view s, std::string& out) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  const char size[4] = {static_cast<char>(n & 0xff),
                        static_cast<char>((n >> 8) & 0xff),
                        static_cast<char>((n >> 16) & 0xff),
                        static_cast<char>((n >> 24) & 0xff)};
  out.append(size, 4);
  out.append(s.data(), s.size());
}

}  // namespace

absl::Status CheckTraceparent(std::string_view tp) {
  // version "-" trace-id(32) "-" parent-id(16) "-" flags(2): 55 characters.
  constexpr size_t kSize = 55;
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StartCall.traceparent is not a W3C traceparent (",
        "00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>): ",
        std::string(why)));
  };
  if (tp.size() < kSize) return bad("too short");
  if (tp[2] != '-' || tp[35] != '-' || tp[52] != '-') {
    return bad("'-' expected after the version, trace-id and parent-id");
  }
  const std::string_view version = tp.substr(0, 2);
  const std::string_view trace_id = tp.substr(3, 32);
  const std::string_view parent_id = tp.substr(36, 16);
  const std::string_view flags = tp.substr(53, 2);
  if (!LowerHex(version) || version == "ff") return bad("invalid version");
  if (version == "00" ? tp.size() != kSize
                      : (tp.size() > kSize && tp[kSize] != '-')) {
    return bad("unexpected characters after the flags");
  }
  if (!LowerHex(trace_id) || AllZero(trace_id)) return bad("invalid trace-id");
  if (!LowerHex(parent_id) || AllZero(parent_id)) {
    return bad("invalid parent-id");
  }
  if (!LowerHex(flags)) return bad("invalid flags");
  return absl::OkStatus();
}

absl::Status CheckCallContext(const runtime::v1::StartCall& start) {
  const bool plain = !start.traceparent().empty() ||
                     !start.tracestate().empty() || !start.baggage().empty();
  if (!plain) return absl::OkStatus();
  if (!start.context().empty()) {
    return absl::InvalidArgumentError(
        "StartCall.context (the pickled carrier) and the plain context fields "
        "(traceparent, tracestate, baggage) are both set; send one of them");
  }
  if (!start.traceparent().empty()) {
    if (auto status = CheckTraceparent(start.traceparent()); !status.ok()) {
      return status;
    }
  }
  for (const auto& [key, value] : start.baggage()) {
    if (key.empty()) {
      return absl::InvalidArgumentError("StartCall.baggage has an empty key");
    }
  }
  return absl::OkStatus();
}

std::string WorkerContext(const runtime::v1::StartCall& start) {
  if (!start.context().empty() ||
      (start.traceparent().empty() && start.baggage().empty())) {
    // A tracestate without a traceparent means nothing (W3C): not sent.
    return start.context();
  }
  std::string out(kPlainContextMagic);
  PutString(start.traceparent(), out);
  PutString(start.traceparent().empty() ? std::string_view() : start.tracestate(),
            out);
  for (const auto& [key, value] : start.baggage()) {
    PutString(key, out);
    PutString(value, out);
  }
  return out;
}

}  // namespace agentix::sandbox
