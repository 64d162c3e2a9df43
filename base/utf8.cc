#include "base/utf8.h"

#include <cstdint>
#include <cstring>

namespace agentix::base {

size_t Utf8SequenceLength(std::string_view text, size_t* invalid) {
  if (text.empty()) return 0;
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const uint8_t lead = p[0];
  if (lead < 0x80) return 1;
  // The allowed range of the second byte depends on the lead byte (table
  // 3-7 of the Unicode standard); later ones are 0x80..0xBF.
  size_t length = 0;
  uint8_t low = 0x80, high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // no overlong forms
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;   // no overlong forms
    if (lead == 0xF4) high = 0x8F;  // nothing above U+10FFFF
  }
  size_t valid = length == 0 ? 0 : 1;  // bytes so far that fit a sequence
  while (valid > 0 && valid < length && valid < text.size()) {
    const uint8_t byte = p[valid];
    const bool fits =
        valid == 1 ? byte >= low && byte <= high : byte >= 0x80 && byte <= 0xBF;
    if (!fits) break;
    ++valid;
  }
  if (valid > 0 && valid == length) return length;
  if (invalid != nullptr) *invalid = valid > 0 ? valid : 1;
  return 0;
}

bool IsValidUtf8(std::string_view text) {
  const char* p = text.data();
  size_t rest = text.size();
  while (rest > 0) {
    // ASCII (most of what is checked: names, ids, messages) eight bytes at
    // a time, without a call per character.
    uint64_t word;
    while (rest >= sizeof word) {
      std::memcpy(&word, p, sizeof word);
      if ((word & 0x8080808080808080ULL) != 0) break;
      p += sizeof word;
      rest -= sizeof word;
    }
    if (rest == 0) break;
    if (static_cast<uint8_t>(*p) < 0x80) {
      ++p;
      --rest;
      continue;
    }
    const size_t length = Utf8SequenceLength(std::string_view(p, rest));
    if (length == 0) return false;
    p += length;
    rest -= length;
  }
  return true;
}

}  // namespace agentix::base
