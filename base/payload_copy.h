// Copies of large payload pieces between the processes' shared rings and
// their own buffers (issue 25, 16 MiB echo).
//
// A 16 MiB echo copies every byte seven times through ~140 MiB of buffers
// (rings, retained results, argument and result values), more than the
// caches hold, so each ordinary copy first reads every destination line from
// memory (read-for-ownership) and then writes it back: about three memory
// passes per copy. glibc's memcpy switches to non-temporal stores only above
// 3/4 of the last-level cache it is told of (480 MiB on our VMs: never). The
// stores here bypass the caches for pieces of kPayloadCopyStreamBytes or
// more: two memory passes. Smaller copies are memcpy (their destination is
// likely read again while still cached).
#pragma once

#include <cstddef>

namespace agentix::base {

// Pieces this large or larger are copied with non-temporal stores.
inline constexpr size_t kPayloadCopyStreamBytes = 256 << 10;

// memcpy(dst, src, n) for non-overlapping ranges; see above. The stores are
// fenced before it returns, so the bytes are visible to another process as
// soon as whatever publishes them (a frame, a release counter) is. For
// destinations whose pages are mapped and reused (the rings, heap buffers
// below kPayloadCopyFreshBytes).
void CopyPayload(void* dst, const void* src, size_t n);

// Heap buffers this large are fresh mmaps (glibc's mmap threshold stops
// growing at 32 MiB, and the daemon and the worker set it there): each page
// faults in zeroed, and the zeroing leaves its lines cached, which streaming
// stores must then evict: slower than memcpy (a 64 MiB echo measured 1.1-1.2x
// the CPU).
inline constexpr size_t kPayloadCopyFreshBytes = 32 << 20;

// CopyPayload into part of a heap buffer of `buffer_bytes` in all (a value
// filled piece by piece): memcpy when that buffer is a fresh mapping.
void CopyPayloadToHeap(void* dst, const void* src, size_t n, size_t buffer_bytes);

}  // namespace agentix::base
