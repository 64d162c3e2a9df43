// Shared memory between the daemon and one worker for large payload pieces
// (argument and result chunks), so they cross as one memcpy into the area
// and one out of it instead of through the socketpair (a kernel copy on each
// side, plus skb allocation and memcg charging per 64 KiB).
//
// One memfd: a header page with the two consumers' release counters, then
// one ring per direction. A frame whose payload lies in a ring carries
// (ring_pos, ring_size) instead of "data" (frame.h); the frames stay on the
// socket, in order, so a ring is consumed in the order it was filled and
// needs no allocator: the producer appends at its tail, the consumer
// publishes how far it has copied (monotonic byte positions; a piece never
// wraps, the producer skips a ring's end instead). A piece that does not fit
// now is sent inline as before, so a full ring (a busy or stuck consumer)
// only falls back to the socket and its backpressure.
//
// The same area also joins a frame-wire host and the daemon
// (docs/FRAME-WIRE.md, "Payload ring"): there the host creates it and the
// daemon maps it with MapSealed. Roles: the creator's outgoing ring is the
// first, the mapper's the second; each side is the producer of one ring and
// the consumer of the other. Put() is called by one thread at a time (the daemon: under the
// session lock; the worker: while owning the channel's write side), Get()
// and Release() by the one reader. The peer is not trusted: positions and
// sizes from frames are checked against the ring, and a garbage release
// counter only makes Put() fall back to the socket.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace agentix::ipc {

// The fd number the worker finds the area on (passed as --payload-fd); next
// to the channel's (frame.h) for the same reason.
inline constexpr int kWorkerPayloadFd = 4;
// Default bytes per ring (two rings per worker; pages are allocated on
// first use and then reused).
inline constexpr size_t kDefaultRingBytes = 16u * 1024 * 1024;
// Pieces smaller than this go inline: the socket is cheap for them.
inline constexpr size_t kRingMinPieceBytes = 64u * 1024;

class PayloadArea {
 public:
  enum class Side { kCreator, kMapper };

  // Daemon: a fresh memfd (close-on-exec) holding two rings of `ring_bytes`
  // (rounded up to whole pages). kResourceExhausted if it cannot be made.
  // `sealed`: its size is sealed (F_SEAL_SHRINK, F_SEAL_GROW), as MapSealed
  // requires of a frame-wire host's area.
  // `ledger_bytes` (rounded up to whole pages): a third region after the
  // rings for the direct calls' ledger (ledger.h); 0 for none.
  static absl::StatusOr<std::unique_ptr<PayloadArea>> Create(
      size_t ring_bytes, bool sealed = false, size_t ledger_bytes = 0);
  // Daemon, for the area a launcher created (Create) and handed to the worker
  // it adopts (sandbox/launch_main.cc): the creator's side of the area behind
  // `fd`, which becomes this object's on success. kInvalidArgument as Map.
  static absl::StatusOr<std::unique_ptr<PayloadArea>> AdoptCreated(int fd);
  // Worker: maps the area behind `fd` (which stays the caller's).
  // kInvalidArgument for an fd that is not such an area.
  static absl::StatusOr<std::unique_ptr<PayloadArea>> Map(int fd);
  // Daemon, for an area a frame-wire host created: as Map, and the memfd
  // must be sealed against shrinking (F_SEAL_SHRINK), so the untrusted
  // creator cannot truncate it under our mapping (reads would fault with
  // SIGBUS). kInvalidArgument naming what is wrong otherwise.
  static absl::StatusOr<std::unique_ptr<PayloadArea>> MapSealed(int fd);

  ~PayloadArea();
  PayloadArea(const PayloadArea&) = delete;
  PayloadArea& operator=(const PayloadArea&) = delete;

  // The memfd (creator side; -1 on the mapper side and after CloseFd()).
  int fd() const { return fd_; }
  // Closes the daemon's fd once the worker holds its copy; the mapping stays.
  void CloseFd();
  size_t ring_bytes() const { return ring_bytes_; }

  // Copies `data` into the outgoing ring and returns its position, or
  // std::nullopt when it does not fit now (send it inline).
  std::optional<uint64_t> Put(std::string_view data);
  // The same for the concatenation of `parts`, gathered into one piece.
  std::optional<uint64_t> Put(absl::Span<const std::string_view> parts);

  // A Put reaching ring pages no Put wrote before fills them at once
  // (base::PopulateFreshForWrite) ahead of its copy when they are at least
  // this many bytes; fewer are left to the copy's faults.
  static constexpr uint64_t kPopulateMinBytes = uint64_t{256} << 10;
  // For tests: the bytes of fresh ring that Puts asked to fill so far.
  uint64_t populated_bytes() const { return populated_bytes_; }
  // The bytes of a payload the peer put at `pos`: a view into the incoming
  // ring, valid until Release() passes it. kInvalidArgument for a piece
  // outside the ring, empty, or before what was already released.
  absl::StatusOr<std::string_view> Get(uint64_t pos, uint64_t size) const;
  // Hands the incoming ring back to the producer up to `end` (pos + size of
  // the last piece taken out; earlier pieces are released with it).
  void Release(uint64_t end);

  // The CPU the worker pins its threads' waits for the daemon's frames to
  // (sandbox/calls_cpu.h, --calls_cpu), or -1: not pinned. A word in the
  // header so the daemon can change it at any time and a waiting thread
  // reads it with one atomic load. The daemon (creator) publishes it; the
  // worker (mapper) reads it. Unused between a frame-wire host and the
  // daemon.
  void PublishWaitCpu(int cpu);
  int WaitCpu() const;

  // The ledger's region (empty when the creator made none); both sides see
  // the same bytes (ledger.h says who writes what).
  absl::Span<char> Ledger() const;

  // Direct calls' counters for the daemon's Info()/Quiet()
  // (docs/DIRECT-CALLS.md, the SessionInfo row): the worker's sessions
  // (mapper) add to the running count as calls start and end and publish
  // each call end's CLOCK_MONOTONIC time; relaxed, no system call. The
  // daemon reads them as untrusted (negative values read as 0).
  void AddDirectRunning(int64_t delta);
  void PublishDirectCallEnd(int64_t monotonic_ns);
  int64_t DirectRunning() const;
  int64_t DirectLastEndNs() const;

 private:
  PayloadArea(Side side, int fd, char* base, size_t map_bytes,
              size_t ring_bytes);
  static absl::StatusOr<std::unique_ptr<PayloadArea>> MapAs(int fd, Side side);

  const Side side_;
  int fd_;
  char* const base_;
  const size_t map_bytes_;
  const size_t ring_bytes_;
  const size_t ledger_bytes_;
  char* out_ring_;
  const char* in_ring_;
  uint64_t* out_released_;  // written by the peer
  uint64_t* in_released_;   // written by us
  std::atomic<int32_t>* wait_cpu_;  // the CPU + 1; 0 (a fresh page): none
  std::atomic<int64_t>* direct_running_;      // written by the mapper
  std::atomic<int64_t>* direct_last_end_ns_;  // written by the mapper
  uint64_t out_tail_ = 0;   // producer: the end of the last piece put
  uint64_t out_floor_ = 0;  // producer: where it restarted an empty ring
  // producer: the ring offset from which our ring's pages were never written
  uint64_t out_fresh_at_ = 0;
  uint64_t populated_bytes_ = 0;  // producer: what Put asked to fill, for tests
  uint64_t in_done_ = 0;    // consumer: what we released last
};

}  // namespace agentix::ipc
