#include "worker/channel/pickle_splitter.h"

#include <algorithm>
#include <cstring>

namespace agentix::worker {
namespace {

enum class Arg { kNone, kFixed, kLength, kLines, kValue, kFrame, kStop, kUnknown };

struct Layout {
  Arg arg;
  int size;  // kFixed / kFrame: bytes; kLength / kValue: length bytes; kLines: lines
  bool is_signed = false;
};

// Opcode argument layouts (pickletools' table, protocols 0-5).
constexpr Layout LayoutOf(uint8_t op) {
  switch (op) {
    case '(': case '0': case '1': case '2': case 'N': case 'Q': case 'R':
    case 'a': case 'b': case 'd': case '}': case 'e': case 'l': case ']':
    case 'o': case 's': case 't': case ')': case 'u': case 0x81: case 0x85:
    case 0x86: case 0x87: case 0x88: case 0x89: case 0x8f: case 0x90:
    case 0x91: case 0x92: case 0x93: case 0x94: case 0x98:
      return {Arg::kNone, 0};
    case '.':
      return {Arg::kStop, 0};
    case 'K': case 'h': case 'q': case 0x80: case 0x82:
      return {Arg::kFixed, 1};
    case 'M': case 0x83:
      return {Arg::kFixed, 2};
    case 'J': case 'j': case 'r': case 0x84:
      return {Arg::kFixed, 4};
    case 'G':
      return {Arg::kFixed, 8};
    case 0x95:
      return {Arg::kFrame, 8};
    case 'U': case 'C': case 0x8a: case 0x8c:
      return {Arg::kLength, 1};
    case 'X':
      return {Arg::kLength, 4};
    case 'T': case 0x8b:
      return {Arg::kLength, 4, /*is_signed=*/true};
    case 0x8d:
      return {Arg::kLength, 8};
    case 'B':
      return {Arg::kValue, 4};
    case 0x8e: case 0x96:
      return {Arg::kValue, 8};
    case 'F': case 'I': case 'L': case 'P': case 'S': case 'V': case 'g':
    case 'p':
      return {Arg::kLines, 1};
    case 'c': case 'i':
      return {Arg::kLines, 2};
    default:  // includes NEXT_BUFFER: the stream has buffers of its own
      return {Arg::kUnknown, 0};
  }
}

}  // namespace

uint64_t PickleSplitter::LittleEndian() const {
  // kValue headers keep the opcode in arg_[0]; the others only the argument.
  const int start = state_ == State::kHeader ? 1 : 0;
  uint64_t value = 0;
  for (int i = arg_size_ - 1; i >= start; --i) value = value << 8 | arg_[i];
  return value;
}

void PickleSplitter::Opcode(uint8_t op, Sink& sink) {
  const Layout layout = LayoutOf(op);
  op_ = op;
  arg_size_ = 0;
  switch (layout.arg) {
    case Arg::kValue:
      // Held back until its length shows whether it leaves the stream.
      arg_[arg_size_++] = op;
      remaining_ = static_cast<uint64_t>(layout.size);
      state_ = State::kHeader;
      return;
    case Arg::kNone:
      state_ = State::kOpcode;
      break;
    case Arg::kFixed:
    case Arg::kFrame:
      remaining_ = static_cast<uint64_t>(layout.size);
      state_ = State::kArgument;
      break;
    case Arg::kLength:
      remaining_ = static_cast<uint64_t>(layout.size);
      signed_length_ = layout.is_signed;
      state_ = State::kLength;
      break;
    case Arg::kLines:
      lines_ = layout.size;
      state_ = State::kLine;
      break;
    case Arg::kStop:
    case Arg::kUnknown:
      state_ = State::kLost;
      break;
  }
  const char byte = static_cast<char>(op);
  sink.Stream(std::string_view(&byte, 1));
}

void PickleSplitter::Feed(std::string_view data, Sink& sink) {
  while (!data.empty()) {
    switch (state_) {
      case State::kLost:
        sink.Stream(data);
        pos_ += data.size();
        return;
      case State::kOpcode: {
        const uint8_t op = static_cast<uint8_t>(data[0]);
        data.remove_prefix(1);
        ++pos_;
        Opcode(op, sink);
        break;
      }
      case State::kArgument:
      case State::kLength:
      case State::kHeader: {
        const size_t n = std::min<uint64_t>(remaining_, data.size());
        std::memcpy(arg_ + arg_size_, data.data(), n);
        arg_size_ += static_cast<int>(n);
        if (state_ != State::kHeader) sink.Stream(data.substr(0, n));
        data.remove_prefix(n);
        pos_ += n;
        remaining_ -= n;
        if (remaining_ != 0) break;
        const uint64_t length = LittleEndian();
        if (state_ == State::kArgument) {
          // A frame's opcodes are passed through whole.
          remaining_ = op_ == 0x95 ? length : 0;
          state_ = remaining_ != 0 ? State::kSkip : State::kOpcode;
        } else if (state_ == State::kLength) {
          if (signed_length_ && (length & 0x80000000u) != 0) {
            state_ = State::kLost;  // refused by the loader anyway
          } else {
            remaining_ = length;
            state_ = length != 0 ? State::kSkip : State::kOpcode;
          }
        } else {
          const std::string_view header(reinterpret_cast<const char*>(arg_),
                                        static_cast<size_t>(arg_size_));
          const ValueKind kind =
              op_ == 0x96 ? ValueKind::kByteArray : ValueKind::kBytes;
          remaining_ = length;
          if (length >= min_value_ && length <= total_ - std::min(pos_, total_) &&
              sink.BeginValue(kind, length, header)) {
            ++values_;
            const char next = kNextBuffer;
            sink.Stream(std::string_view(&next, 1));
            state_ = State::kValue;
          } else {
            sink.Stream(header);
            state_ = length != 0 ? State::kSkip : State::kOpcode;
          }
        }
        break;
      }
      case State::kSkip:
      case State::kValue: {
        const size_t n = std::min<uint64_t>(remaining_, data.size());
        if (state_ == State::kSkip) {
          sink.Stream(data.substr(0, n));
        } else {
          sink.Value(data.substr(0, n));
        }
        data.remove_prefix(n);
        pos_ += n;
        remaining_ -= n;
        if (remaining_ == 0) state_ = State::kOpcode;
        break;
      }
      case State::kLine: {
        const size_t end = data.find('\n');
        const size_t n = end == std::string_view::npos ? data.size() : end + 1;
        sink.Stream(data.substr(0, n));
        data.remove_prefix(n);
        pos_ += n;
        if (end != std::string_view::npos && --lines_ == 0) {
          state_ = State::kOpcode;
        }
        break;
      }
    }
  }
}

}  // namespace agentix::worker
