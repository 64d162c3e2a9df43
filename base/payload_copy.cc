#include "base/payload_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

namespace agentix::base {

#if defined(__SSE2__)
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kPages = 4;  // streams interleaved

// One 64-byte line from `in` to `out` (64-byte aligned), around the caches.
inline void StreamLine(char* out, const char* in) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 16));
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 32));
  const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 48));
  _mm_stream_si128(reinterpret_cast<__m128i*>(out), a);
  _mm_stream_si128(reinterpret_cast<__m128i*>(out + 16), b);
  _mm_stream_si128(reinterpret_cast<__m128i*>(out + 32), c);
  _mm_stream_si128(reinterpret_cast<__m128i*>(out + 48), d);
}

}  // namespace
#endif

void CopyPayload(void* dst, const void* src, size_t n) {
#if defined(__SSE2__)
  if (n >= kPayloadCopyStreamBytes) {
    auto* out = static_cast<char*>(dst);
    const auto* in = static_cast<const char*>(src);
    // From a page boundary of the destination on: whole lines (the
    // write-combining buffers never read anything back) and four pages
    // written side by side, a line of each in turn, with the source's next
    // four pages prefetched. One stream at a time measured slower than
    // memcpy here; four (as glibc's own non-temporal path does) faster.
    const size_t head = (kPage - (reinterpret_cast<uintptr_t>(out) & (kPage - 1))) & (kPage - 1);
    std::memcpy(out, in, head);
    out += head;
    in += head;
    n -= head;
    for (; n >= kPages * kPage; n -= kPages * kPage, out += kPages * kPage, in += kPages * kPage) {
      for (size_t line = 0; line < kPage; line += 64) {
        for (size_t page = 0; page < kPages; ++page) {
          const char* from = in + page * kPage + line;
          _mm_prefetch(from + kPages * kPage, _MM_HINT_T0);
          StreamLine(out + page * kPage + line, from);
        }
      }
    }
    std::memcpy(out, in, n);
    _mm_sfence();  // the streamed lines are ordered before later stores
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

void CopyPayloadToHeap(void* dst, const void* src, size_t n, size_t buffer_bytes) {
  if (buffer_bytes >= kPayloadCopyFreshBytes) {
    std::memcpy(dst, src, n);
  } else {
    CopyPayload(dst, src, n);
  }
}

}  // namespace agentix::base
