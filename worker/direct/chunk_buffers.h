// Recycled buffers for direct calls' result chunks (docs/DECISIONS.md,
// "stop-40: a direct result is cut once …"). A direct call's result is
// copied once out of the caller's Python buffers into 1 MiB chunk strings,
// which its session retains until the host acks them. The copy runs on
// whichever pool thread replied, so fresh strings come from that thread's
// malloc arena: once the 16- and 64-caller phases have spread replies over
// many threads, a 16 MiB echo faulted in 16 MiB of fresh pages each time.
// Chunks taken from here and given back when their event is destroyed
// reuse the same, already faulted-in memory whichever thread replies. A
// direct argument of one piece from 64 KiB to 1 MiB takes its driver frame's
// buffer here too (DirectSession::PutArgBytes); a chunked one is copied
// straight into the call's upload instead (DriverSink::Land).
//
// Freeing a buffer instead would leave it in that thread's arena for good
// (base/malloc_tuning keeps freed heap mapped): a pair of 48 MiB echoes needs
// ~190 buffers at once, and buffers freed over many threads' arenas made the
// worker's RSS grow round after round (docs/DECISIONS.md, "stop-40: direct
// chunk buffers are kept, most without their pages"). So many buffers are
// kept, but only a few keep their pages: the others give them back
// (madvise) and have them faulted in again, in one call, when next taken.
//
// Thread-safe; Take and Give take a leaf lock (Give may run under a
// session's lock, from an event's deleter).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agentix/runtime/v1/runtime.pb.h"

namespace agentix::worker {

class ChunkBuffers : public std::enable_shared_from_this<ChunkBuffers> {
 public:
  // Keeps at most `max_kept` buffers (each at least ipc::kChunkBytes of
  // capacity) between uses; more are freed. At most `max_faulted` of them
  // keep their pages; the others are kept released.
  static std::shared_ptr<ChunkBuffers> Create(size_t max_kept,
                                              size_t max_faulted = SIZE_MAX);
  ChunkBuffers(const ChunkBuffers&) = delete;
  ChunkBuffers& operator=(const ChunkBuffers&) = delete;

  // An empty string with room for `size` bytes: a kept buffer (one with
  // its pages first) when `size` is at most ipc::kChunkBytes and one is
  // kept, else a fresh allocation (of at least ipc::kChunkBytes, so that it
  // can be kept). A kept buffer without its pages gets those its first
  // `size` bytes reach faulted in at once (MADV_POPULATE_WRITE), cheaper
  // than a page fault a page as they are written.
  // Throws std::bad_alloc as std::string::reserve does (the caller turns
  // it into a Status).
  std::string Take(size_t size);
  // Keeps `buffer` for a later Take (its bytes are dropped, its capacity
  // kept) if it holds at least ipc::kChunkBytes and fewer than max_kept
  // are kept; frees it otherwise. A buffer kept beyond max_faulted gives
  // its pages back first.
  void Give(std::string buffer);

  // A ResultChunk event of `call_id` holding `data`; when the event is
  // destroyed (its last reference dropped, on any thread) the data's
  // buffer comes back here. Keeps this object alive until then.
  std::shared_ptr<runtime::v1::SandboxEvent> ChunkEvent(
      const std::string& call_id, std::string data);

  // Takes served from a kept buffer / by a fresh allocation, buffers
  // kept now / kept with their pages given back now; for tests and
  // diagnostics.
  uint64_t reused();
  uint64_t fresh();
  uint64_t kept();
  uint64_t kept_released();

 private:
  ChunkBuffers(size_t max_kept, size_t max_faulted)
      : max_kept_(max_kept), max_faulted_(max_faulted) {}

  const size_t max_kept_;
  const size_t max_faulted_;
  absl::Mutex mu_;
  std::vector<std::string> faulted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> released_ ABSL_GUARDED_BY(mu_);
  uint64_t reused_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t fresh_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace agentix::worker
