// The ledger: the ids of a worker's direct calls, kept in memory the daemon
// also maps, so the daemon can keep the Calls promises (at most once, a
// typed WorkerDied on resume) after the worker dies (docs/DIRECT-CALLS.md,
// "The ledger"). The daemon formats the region and assigns client slots;
// the worker writes call slots and the finished ring with plain stores and a
// release store of each slot's state last — no system call; after a death
// the daemon reads it back as untrusted input (ReadLedger).
//
// Layout (all little-endian, offsets from the region's start):
//   header (64 bytes): u64 magic, u32 call_slots, u32 finished_slots,
//     u64 finished_count (how many ids the worker appended, ever)
//   call slots, kLedgerCallSlotBytes each:
//     u32 state (LedgerState), u32 client slot, u16 id length, 6 bytes
//     padding, the id (≤ kLedgerMaxIdBytes)
//   finished ring, kLedgerFinishedSlotBytes each:
//     u32 state (0 empty, 1 written), u16 client slot, u8 id length,
//     u8 padding, the id (≤ kLedgerFinishedIdBytes)
// The finished ring's slots are 48 bytes rather than the design's 32 (a
// length and a client slot beside the id): a Python host's 32-hex id and a
// UUID's 36 characters fit inline; a longer id is not remembered across a
// worker death (counted in LedgerWriter::finished_too_long()).
//
// The client table (index = client slot) lives in the daemon's memory
// (LedgerClients), not in the region: the worker never needs to read it
// back, and the daemon must not trust what the worker could overwrite.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace agentix::ipc {

// The longest call id (wire/wire_limits.h's kMaxCallIdBytes; this library
// does not depend on //wire).
inline constexpr size_t kLedgerMaxIdBytes = 256;
inline constexpr size_t kLedgerHeaderBytes = 64;
inline constexpr size_t kLedgerCallSlotBytes = 16 + kLedgerMaxIdBytes;
inline constexpr size_t kLedgerFinishedIdBytes = 40;
inline constexpr size_t kLedgerFinishedSlotBytes = 8 + kLedgerFinishedIdBytes;
// The finished ring's pages are faulted in this many bytes ahead at once.
inline constexpr size_t kLedgerPopulateBytes = size_t{64} << 10;
// Bounds the daemon accepts when it formats (and so when it reads back).
inline constexpr uint32_t kLedgerMaxCallSlots = 1u << 20;
inline constexpr uint32_t kLedgerMaxFinishedSlots = 1u << 20;
// Client slots the daemon hands out (distinct client ids per worker).
inline constexpr uint32_t kLedgerMaxClients = 4096;

enum class LedgerState : uint32_t {
  kFree = 0,
  kRunning = 1,   // accepted, not terminal
  kRetained = 2,  // terminal, its result kept for the host
};

// Bytes a region of `call_slots` and `finished_slots` takes.
size_t LedgerBytes(uint32_t call_slots, uint32_t finished_slots);

// Daemon: writes an empty ledger into `region` (LedgerBytes long). Its
// slots are cleared unless `region_is_zero` (a fresh memfd's pages already
// are: clearing them would fault in every page, ~4 MiB at the daemon's
// defaults, before each worker's spawn). kInvalidArgument for counts over
// the bounds or a short region.
absl::Status FormatLedger(absl::Span<char> region, uint32_t call_slots,
                          uint32_t finished_slots, bool region_is_zero = false);

// Daemon, adopting a worker whose launcher formatted the ledger
// (sandbox/launch_main.cc): OK if `region` holds one of exactly these counts,
// kFailedPrecondition naming the difference otherwise.
absl::Status CheckLedgerFormat(absl::Span<const char> region,
                               uint32_t call_slots, uint32_t finished_slots);

// Daemon: the client ids it assigned slots to, in its own memory.
class LedgerClients {
 public:
  // The slot of `client` (assigned at its first hand-over), or
  // kResourceExhausted past kLedgerMaxClients.
  absl::StatusOr<uint32_t> SlotOf(std::string_view client);
  // The client id of `slot`, or nullptr for a slot never assigned.
  const std::string* ClientOf(uint32_t slot) const;
  size_t size() const { return clients_.size(); }

 private:
  std::vector<std::string> clients_;
  absl::flat_hash_map<std::string, uint32_t> slots_;
};

// Worker: writes the ledger the daemon formatted. Thread-safe (the
// sessions of several clients share it); one short lock, no system call —
// but one in the finished ring's first pass every kLedgerPopulateBytes: the
// ring's fresh pages (3 MiB at the daemon's defaults, filled one id a call)
// are faulted in that many at a time, not one in ~85 calls (~11 µs each on
// these VMs; issue 25's tail, stop 49).
class LedgerWriter {
 public:
  // kInvalidArgument if `region` does not hold a formatted ledger (its
  // header's counts must fit `region`).
  static absl::StatusOr<std::unique_ptr<LedgerWriter>> Open(
      absl::Span<char> region);

  // A direct StartCall of `id` by the client in `client_slot` was accepted:
  // the slot now written (kRunning), or std::nullopt when every slot is
  // taken or the id is too long (the call runs; after a worker death it
  // would be unknown to the daemon — counted in unrecorded()).
  std::optional<uint32_t> Started(uint32_t client_slot, std::string_view id);
  // The call in `slot` reached its terminal event: kRetained.
  void Retained(uint32_t slot);
  // The call's result was acked or evicted: the slot is freed and its id
  // appended to the finished ring.
  void Finished(uint32_t slot);
  // The call's id went to the daemon with its session (collapse): the slot
  // is freed and nothing enters the finished ring.
  void Forget(uint32_t slot);

  uint64_t unrecorded() const;
  uint64_t finished_too_long() const;

 private:
  LedgerWriter(absl::Span<char> region, uint32_t call_slots,
               uint32_t finished_slots);
  char* CallSlot(uint32_t slot) const;
  char* FinishedRing() const;  // its first slot
  char* FinishedSlot(uint64_t index) const;
  // First pass: faults in the ring's pages from the one holding `slot_end`
  // on, kLedgerPopulateBytes of them, unless done already.
  void PopulateAhead(const char* slot_end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Span<char> region_;
  const uint32_t call_slots_;
  const uint32_t finished_slots_;
  mutable absl::Mutex mu_;
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);  // free call slots
  uint64_t finished_count_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t unrecorded_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t finished_too_long_ ABSL_GUARDED_BY(mu_) = 0;
  // The finished ring is faulted in below this (its first pass).
  const char* populated_end_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// One live call found in a ledger.
struct LedgerCall {
  std::string client;
  std::string id;
  bool running = false;  // false: retained (terminal, result not acked)
};

struct LedgerFinished {
  std::string client;
  std::string id;
};

struct LedgerContents {
  std::vector<LedgerCall> calls;
  std::vector<LedgerFinished> finished;  // oldest first
  // Slots that were not free but did not hold a valid entry (an unknown
  // state or client slot, an id length past the slot, an empty id).
  size_t skipped = 0;
};

// Daemon, after the worker died: the ledger in `region`, which the daemon
// formatted with these counts (the header is the worker's to scribble on,
// so the counts are the daemon's own). Every slot is copied out before it
// is looked at; garbage is skipped and counted, never trusted.
// kInvalidArgument only for a region shorter than the counts need.
absl::StatusOr<LedgerContents> ReadLedger(absl::Span<const char> region,
                                          uint32_t call_slots,
                                          uint32_t finished_slots,
                                          const LedgerClients& clients);

}  // namespace agentix::ipc
