// PickleSplitter: which values leave the stream, what the stream becomes,
// whatever the pieces it arrives in.
#include "worker/channel/pickle_splitter.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace agentix::worker {
namespace {

constexpr uint64_t kMin = 16;

class RecordingSink : public PickleSplitter::Sink {
 public:
  void Stream(std::string_view bytes) override { stream.append(bytes); }
  bool BeginValue(PickleSplitter::ValueKind kind, uint64_t size,
                  std::string_view header) override {
    headers.emplace_back(header);
    if (refuse) return false;
    kinds.push_back(kind);
    sizes.push_back(size);
    values.emplace_back();
    return true;
  }
  void Value(std::string_view bytes) override { values.back().append(bytes); }

  bool refuse = false;
  std::string stream;
  std::vector<std::string> headers;
  std::vector<PickleSplitter::ValueKind> kinds;
  std::vector<uint64_t> sizes;
  std::vector<std::string> values;
};

std::string LittleEndian(uint64_t value, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
  return out;
}

std::string Frame(const std::string& body) {
  return "\x95" + LittleEndian(body.size(), 8) + body;
}

std::string BinBytes(const std::string& value) {
  return "B" + LittleEndian(value.size(), 4) + value;
}

// Feeds `stream` in pieces of `piece` bytes (0: whole).
RecordingSink Split(const std::string& stream, size_t piece, bool refuse = false,
                    uint64_t total = 0) {
  RecordingSink sink;
  sink.refuse = refuse;
  PickleSplitter splitter(total != 0 ? total : stream.size(), kMin);
  if (piece == 0) piece = stream.size();
  for (size_t at = 0; at < stream.size(); at += piece) {
    splitter.Feed(std::string_view(stream).substr(at, piece), sink);
  }
  CHECK(splitter.values() == sink.values.size());
  return sink;
}

const std::string kBig(40, 'r');      // takes 'r' (LONG_BINPUT) as data
const std::string kOther(20, '\x95');  // FRAME bytes as data

TEST_CASE("large values outside frames leave the stream", "[pickle_splitter]") {
  // pickle.dumps(((big, other), {}), protocol=5) in CPython's shape: a
  // frame, the large values after it, a frame with the rest.
  const std::string head = "\x80\x05" + Frame("\x94(");
  const std::string tail = Frame("\x94\x86\x94}\x94\x86\x94.");
  const std::string stream = head + BinBytes(kBig) + "\x94" +
                             "\x8e" + LittleEndian(kOther.size(), 8) + kOther +
                             tail;
  const std::string expected = head + "\x97\x94" + "\x97" + tail;
  for (size_t piece : {0, 1, 2, 3, 5, 7, 11, 64}) {
    INFO("piece " << piece);
    RecordingSink sink = Split(stream, piece);
    CHECK(sink.stream == expected);
    CHECK(sink.values == std::vector<std::string>{kBig, kOther});
    CHECK(sink.sizes == std::vector<uint64_t>{kBig.size(), kOther.size()});
    CHECK(sink.kinds == std::vector<PickleSplitter::ValueKind>{
                            PickleSplitter::ValueKind::kBytes,
                            PickleSplitter::ValueKind::kBytes});
    CHECK(sink.headers[0] == "B" + LittleEndian(kBig.size(), 4));
  }
}

TEST_CASE("bytearrays leave as bytearrays", "[pickle_splitter]") {
  const std::string stream =
      "\x80\x05\x96" + LittleEndian(kBig.size(), 8) + kBig + "\x94.";
  RecordingSink sink = Split(stream, 3);
  CHECK(sink.stream == "\x80\x05\x97\x94.");
  CHECK(sink.kinds ==
        std::vector<PickleSplitter::ValueKind>{PickleSplitter::ValueKind::kByteArray});
  CHECK(sink.values == std::vector<std::string>{kBig});
}

TEST_CASE("everything else stays in the stream", "[pickle_splitter]") {
  const std::string small = BinBytes(std::string(kMin - 1, 'x'));
  SECTION("a value below the minimum") {
    const std::string stream = "\x80\x05" + small + ".";
    CHECK(Split(stream, 1).stream == stream);
  }
  SECTION("a large value inside a frame") {
    const std::string stream = "\x80\x05" + Frame(BinBytes(kBig) + "\x94") + ".";
    RecordingSink sink = Split(stream, 4);
    CHECK(sink.stream == stream);
    CHECK(sink.values.empty());
  }
  SECTION("a value longer than what is left of the stream") {
    const std::string stream = "\x80\x05" + BinBytes(kBig);
    RecordingSink sink = Split(stream.substr(0, stream.size() - 1), 0, false,
                               stream.size() - 1);
    CHECK(sink.stream == stream.substr(0, stream.size() - 1));
    CHECK(sink.values.empty());
  }
  SECTION("a value the sink refuses") {
    const std::string stream = "\x80\x05" + BinBytes(kBig) + ".";
    RecordingSink sink = Split(stream, 5, /*refuse=*/true);
    CHECK(sink.stream == stream);
    CHECK(sink.headers.size() == 1);
  }
  SECTION("after the stream's own NEXT_BUFFER, an unknown opcode or STOP") {
    for (const std::string& stop : {std::string("\x97"), std::string("\xff"),
                                    std::string(".")}) {
      const std::string stream = "\x80\x05" + stop + BinBytes(kBig);
      RecordingSink sink = Split(stream, 2);
      CHECK(sink.stream == stream);
      CHECK(sink.values.empty());
    }
  }
  SECTION("a negative signed length (refused by the loader)") {
    const std::string stream = "\x80\x05T\xff\xff\xff\xff" + BinBytes(kBig);
    CHECK(Split(stream, 0).stream == stream);
  }
}

TEST_CASE("every argument layout is walked over", "[pickle_splitter]") {
  // Protocol 0-4 opcodes before a large value: lines (GLOBAL's two),
  // fixed arguments, 1/4/8-byte lengths holding opcode bytes as data.
  const std::string before =
      std::string("\x80\x02") + "cmod\nname\n" + "I12\n" + "K\x01" +
      "M\x01\x02" + "J\x01\x02\x03\x04" + "G" + std::string(8, 'B') +
      "q\x01" + std::string("r\x01\x00\x00\x00", 5) + "U\x02" + "BB" + "X" +
      LittleEndian(3, 4) + "\x96\x96\x96" + "\x8d" + LittleEndian(2, 8) + "BB" +
      "T" + LittleEndian(1, 4) + "B" + "\x8b" + LittleEndian(1, 4) + "\x01" +
      "C\x01" + "B" + "\x8a\x01\x01" + "\x8c\x01" + "B" + "(t)\x85\x94";
  const std::string stream = before + BinBytes(kBig) + "\x94.";
  for (size_t piece : {0, 1, 6}) {
    INFO("piece " << piece);
    RecordingSink sink = Split(stream, piece);
    CHECK(sink.stream == before + "\x97\x94.");
    CHECK(sink.values == std::vector<std::string>{kBig});
  }
}

}  // namespace
}  // namespace agentix::worker
