// Takes the large bytes values out of a pickle stream as it arrives, so a
// chunked call's arguments are copied once (ring -> the value's own buffer)
// instead of twice (ring -> the whole stream -> pickle.loads' copy of each
// value).
//
// A value of at least `min_value_bytes` written by BINBYTES, BINBYTES8 or
// BYTEARRAY8 outside a frame (CPython's pickler writes every value of 64 KiB
// or more that way) goes to the sink as a value of its own, and the stream
// gets protocol 5's NEXT_BUFFER opcode in its place: pickle.loads(stream,
// buffers=values) then pushes the very object the sink made, which is what
// the opcode would have produced. Everything else is passed through as it
// is. Frames are passed through whole without looking inside (their opcodes
// are small, and CPython never lets an opcode straddle a frame's end), so
// the walk costs a few steps per large value, not per byte.
//
// A stream this walk cannot follow (an unknown opcode, a NEXT_BUFFER of its
// own, anything after STOP) is passed through unchanged from there on; a
// value is only taken out when its whole length is still due, so a
// truncated or over-long stream decodes (or fails) as it would have.
#pragma once

#include <cstdint>
#include <string_view>

namespace agentix::worker {

class PickleSplitter {
 public:
  enum class ValueKind { kBytes, kByteArray };

  class Sink {
   public:
    virtual ~Sink() = default;
    // Bytes of the stream proper, in order.
    virtual void Stream(std::string_view bytes) = 0;
    // A value of `size` bytes starts (its bytes follow through Value()).
    // `header` is its opcode and length as they were in the stream; false
    // leaves the value in the stream (e.g. it could not be allocated).
    virtual bool BeginValue(ValueKind kind, uint64_t size,
                            std::string_view header) = 0;
    // The next bytes of the current value.
    virtual void Value(std::string_view bytes) = 0;
  };

  // `total` is the stream's announced size: a value longer than what is
  // left of it is never taken out.
  PickleSplitter(uint64_t total, uint64_t min_value_bytes)
      : total_(total), min_value_(min_value_bytes) {}

  // The next bytes of the stream.
  void Feed(std::string_view data, Sink& sink);

  // Values taken out so far.
  uint64_t values() const { return values_; }

  static constexpr char kNextBuffer = '\x97';

 private:
  enum class State { kOpcode, kArgument, kLength, kHeader, kSkip, kValue, kLine, kLost };

  // Starts the opcode `op` at the current position (already consumed).
  void Opcode(uint8_t op, Sink& sink);
  uint64_t LittleEndian() const;

  const uint64_t total_;
  const uint64_t min_value_;
  State state_ = State::kOpcode;
  uint64_t pos_ = 0;        // bytes of the stream consumed
  uint64_t remaining_ = 0;  // kSkip / kValue bytes, kArgument / kLength / kHeader bytes
  uint8_t op_ = 0;          // the opcode whose argument is being read
  int lines_ = 0;           // kLine: newline-ended arguments still due
  bool signed_length_ = false;
  uint8_t arg_[9] = {};     // the opcode (kHeader) and its fixed argument
  int arg_size_ = 0;
  uint64_t values_ = 0;
};

}  // namespace agentix::worker
