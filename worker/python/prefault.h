// Moves the worker's first touches of fresh memory off its boot's thread.
//
// On this project's VMs the first access to a fresh anonymous page costs
// ~11 µs (the fault and the first access after it), and a cold worker touches
// ~2,500 of them before its first result, all on the one thread that boots
// the interpreter. A second thread on the otherwise idle CPU can fault the
// pages in and access them first; the boot thread then finds them ready.
// Which pages: CPython's object arenas (handed out from a reserve through
// PyObject_SetArenaAllocator), the top of malloc's main heap and libpython's
// mapped file (the executable's, when it links libpython statically).
// Before the thread starts, the executable's writable data and bss (the
// interpreter's static objects, whose reference counts the boot writes) are
// faulted in at once on the calling thread: one system call instead of ~300
// copy-on-write faults, each dearer than an anonymous page's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace agentix::worker {

struct PrefaultOptions {
  // CPython's object arenas come from a reserve of this many MiB (1 MiB
  // arenas, in order), faulted in ahead of use; arenas beyond it are mapped
  // as CPython maps them. 0: no reserve.
  size_t arena_mib = 0;
  // This many MiB at the top of malloc's main heap are faulted in ahead of
  // use (allocated once and freed, so the heap keeps them: the worker's
  // malloc trim threshold is far above). 0: none.
  size_t heap_mib = 0;
  // libpython's mapped file pages (its loadable segments' file part) are
  // read once, a MiB at a time between the others: the boot thread then
  // finds their page-table entries made. With libpython linked statically
  // (no shared libpython loaded), the executable's own. false: not read.
  bool libpython = false;
  // The executable's writable loadable segments past its read-only-after-
  // relocation part (.data, .bss) faulted in for writing, at once, before
  // StartPrefault returns. false: left to the boot's writes.
  bool image_data = false;
};

// Faults in the image data (options.image_data), installs the arena
// reserve and starts a detached thread that faults in
// the reserve's and the heap's pages, interleaved in the order a booting
// interpreter uses them. Call once, before the interpreter starts. An error
// (no memory for the reserve) leaves CPython's own arena allocator in place.
absl::Status StartPrefault(const PrefaultOptions& options);

// For tests and diagnostics.
struct PrefaultState {
  uintptr_t reserve_begin = 0;  // the arena reserve, [begin, end)
  uintptr_t reserve_end = 0;
  size_t arenas_from_reserve = 0;  // handed out, reused ones included
  size_t arenas_mapped = 0;        // beyond the reserve
  size_t pages_done = 0;           // faulted in or read by the thread so far
  size_t library_pages = 0;        // of which libpython's
  size_t image_data_pages = 0;     // the executable's data and bss, faulted in at once
  bool finished = false;           // the thread is done
};
PrefaultState GetPrefaultState();

}  // namespace agentix::worker
