// Allocator settings for processes that move large payloads in pieces.
#pragma once

namespace agentix::base {

// Keeps buffers below 32 MiB on the heap instead of fresh mmap()s, and lets
// up to 128 MiB of freed heap stay mapped. First-touching fresh pages costs
// ~12-15 µs per 4 KiB on our VMs, which dominated 16 MiB transfers
// (shared/PERFORMANCE-NOTES.md item 3). Does nothing when GLIBC_TUNABLES is
// set: an explicit operator choice wins. Call first thing in main().
void TuneMallocForLargeBuffers();

// Gives freed heap memory back to the OS (malloc_trim), e.g. after a client
// that made the process hold a lot has gone: glibc otherwise keeps freed
// pages below the top of the heap mapped for good. Takes a few ms on a
// large heap; call it from a background thread.
void ReleaseFreeMemory();

}  // namespace agentix::base
