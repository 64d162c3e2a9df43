#include "worker/ipc/session_state.h"

#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace agentix::ipc {
namespace {

constexpr uint8_t kCallKind = 1;
constexpr uint8_t kFinishedKind = 2;

template <typename T>
void Put(std::string& out, T v) {
  char bytes[sizeof v];
  std::memcpy(bytes, &v, sizeof v);
  out.append(bytes, sizeof v);
}

// Reads from an untrusted piece: every read checks what is left.
class Cursor {
 public:
  explicit Cursor(std::string_view in) : in_(in) {}
  bool done() const { return in_.empty(); }
  template <typename T>
  bool Read(T& v) {
    if (in_.size() < sizeof v) return false;
    std::memcpy(&v, in_.data(), sizeof v);
    in_.remove_prefix(sizeof v);
    return true;
  }
  bool Bytes(size_t n, std::string& out) {
    if (in_.size() < n) return false;
    out.assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }

 private:
  std::string_view in_;
};

size_t CallHeadBytes(const CollapsedCall& call) {
  return 1 + 1 + 2 + call.id.size() + 4;
}

// One call's head with `count` events from `events`.
void AppendCall(std::string& out, const CollapsedCall& call, size_t first,
                size_t count) {
  Put<uint8_t>(out, kCallKind);
  Put<uint8_t>(out, call.running ? 1 : 0);
  Put<uint16_t>(out, static_cast<uint16_t>(call.id.size()));
  out += call.id;
  Put<uint32_t>(out, static_cast<uint32_t>(count));
  for (size_t i = first; i < first + count; ++i) {
    Put<uint32_t>(out, static_cast<uint32_t>(call.delivered[i].size()));
    out += call.delivered[i];
  }
}

}  // namespace

std::vector<std::string> EncodeSessionState(const SessionState& state,
                                            size_t max_piece_bytes) {
  std::vector<std::string> pieces(1);
  auto room = [&](size_t n) {
    if (!pieces.back().empty() && pieces.back().size() + n > max_piece_bytes) {
      pieces.emplace_back();
    }
  };
  for (const CollapsedCall& call : state.calls) {
    // As many events per piece as fit; a call with none still has a head.
    size_t next = 0;
    do {
      size_t bytes = CallHeadBytes(call);
      size_t count = 0;
      while (next + count < call.delivered.size()) {
        const size_t more = 4 + call.delivered[next + count].size();
        if (count > 0 && bytes + more > max_piece_bytes) break;
        bytes += more;
        ++count;
      }
      room(bytes);
      AppendCall(pieces.back(), call, next, count);
      next += count;
    } while (next < call.delivered.size());
  }
  for (const std::string& id : state.finished) {
    room(1 + 2 + id.size());
    Put<uint8_t>(pieces.back(), kFinishedKind);
    Put<uint16_t>(pieces.back(), static_cast<uint16_t>(id.size()));
    pieces.back() += id;
  }
  return pieces;
}

absl::Status DecodeSessionStatePiece(std::string_view piece,
                                     SessionState& into) {
  SessionState got;
  Cursor in(piece);
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed session_state piece: ", what));
  };
  auto read_id = [&](std::string& id) {
    uint16_t length = 0;
    return in.Read(length) && length > 0 &&
           length <= kSessionStateMaxIdBytes && in.Bytes(length, id);
  };
  while (!in.done()) {
    uint8_t kind = 0;
    in.Read(kind);
    if (kind == kFinishedKind) {
      std::string id;
      if (!read_id(id)) return bad("a finished id");
      got.finished.push_back(std::move(id));
      continue;
    }
    if (kind != kCallKind) return bad(absl::StrCat("entry kind ", int{kind}));
    CollapsedCall call;
    uint8_t running = 2;
    uint32_t events = 0;
    if (!in.Read(running) || running > 1 || !read_id(call.id) ||
        !in.Read(events)) {
      return bad("a call's head");
    }
    for (uint32_t i = 0; i < events; ++i) {
      uint32_t length = 0;
      std::string event;
      if (!in.Read(length) || !in.Bytes(length, event)) {
        return bad(absl::StrCat("event ", i, " of call ", call.id));
      }
      call.delivered.push_back(std::move(event));
    }
    call.running = running == 1;
    got.calls.push_back(std::move(call));
  }
  for (CollapsedCall& call : got.calls) {
    if (!into.calls.empty() && into.calls.back().id == call.id) {
      CollapsedCall& last = into.calls.back();
      last.running = call.running;
      for (std::string& e : call.delivered) last.delivered.push_back(std::move(e));
    } else {
      into.calls.push_back(std::move(call));
    }
  }
  for (std::string& id : got.finished) into.finished.push_back(std::move(id));
  return absl::OkStatus();
}

}  // namespace agentix::ipc
