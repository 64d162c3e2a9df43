// UTF-8 well-formedness (RFC 3629: no overlong forms, no surrogates, nothing
// above U+10FFFF), as protobuf requires of proto3 strings and as Python's
// strict decoder accepts.
#ifndef AGENTIX_BASE_UTF8_H_
#define AGENTIX_BASE_UTF8_H_

#include <cstddef>
#include <string_view>

namespace agentix::base {

// The length (1-4) of the well-formed sequence `text` starts with, or 0 when
// it starts with none (or is empty). Then, if `invalid` is given, it gets
// the length of the longest start of `text` that could still begin a
// sequence (at least 1): the unit Python's errors="replace" replaces.
size_t Utf8SequenceLength(std::string_view text, size_t* invalid = nullptr);

// True when all of `text` is well-formed UTF-8.
bool IsValidUtf8(std::string_view text);

}  // namespace agentix::base

#endif  // AGENTIX_BASE_UTF8_H_
