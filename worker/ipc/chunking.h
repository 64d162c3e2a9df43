#pragma once

// How payloads are cut into pieces, on both sides of the daemon <-> worker
// channel (and, with the same size, on the host's Calls stream:
// agentix.runtime.client.chunking.CHUNK_BYTES). Header-only: the daemon,
// the worker and the test doubles include it without the frame codec.

#include <cstddef>
#include <string_view>

namespace agentix::ipc {

// Size of the pieces large payloads are cut into (arguments and results).
// The daemon refuses larger ArgumentChunks from the host.
inline constexpr size_t kChunkBytes = 1u * 1024 * 1024;

// How a result of `size` bytes is cut: `full` pieces of kChunkBytes, then
// the `last` bytes (1..kChunkBytes, or 0 for an empty payload), which go
// in the terminal frame so it always carries data when there is any.
struct TailSplit {
  size_t full;
  size_t last;
};

constexpr TailSplit SplitWithTail(size_t size) {
  if (size <= kChunkBytes) return {0, size};
  const size_t last = size % kChunkBytes == 0 ? kChunkBytes : size % kChunkBytes;
  return {(size - last) / kChunkBytes, last};
}

// Calls `fn(piece)` for `bytes` in order, in pieces of kChunkBytes (the
// last one shorter); not at all for empty `bytes`. Pieces are views.
template <typename Fn>
void ForEachChunk(std::string_view bytes, Fn&& fn) {
  for (size_t off = 0; off < bytes.size(); off += kChunkBytes) {
    fn(bytes.substr(off, kChunkBytes));
  }
}

}  // namespace agentix::ipc
