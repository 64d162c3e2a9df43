#include "worker/ipc/ledger.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/fresh_pages.h"

namespace agentix::ipc {
namespace {

constexpr uint64_t kMagic = 0x314752444c584741ull;  // "AGXLDGR1"
constexpr size_t kCallSlotsOffset = 8;
constexpr size_t kFinishedSlotsOffset = 12;
constexpr size_t kFinishedCountOffset = 16;
constexpr uint32_t kFinishedWritten = 1;

// The state words are shared with the daemon: the worker's writes are
// published by a release store of the state (the daemon reads them only
// after the worker is gone, so it needs no acquire).
void StoreState(char* p, uint32_t v) {
  __atomic_store_n(reinterpret_cast<uint32_t*>(p), v, __ATOMIC_RELEASE);
}

template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
void Store(char* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

}  // namespace

size_t LedgerBytes(uint32_t call_slots, uint32_t finished_slots) {
  return kLedgerHeaderBytes + size_t{call_slots} * kLedgerCallSlotBytes +
         size_t{finished_slots} * kLedgerFinishedSlotBytes;
}

absl::Status FormatLedger(absl::Span<char> region, uint32_t call_slots,
                          uint32_t finished_slots, bool region_is_zero) {
  if (call_slots > kLedgerMaxCallSlots ||
      finished_slots > kLedgerMaxFinishedSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("ledger of ", call_slots, " call slots and ",
                     finished_slots, " finished slots is over the bounds"));
  }
  const size_t need = LedgerBytes(call_slots, finished_slots);
  if (region.size() < need) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ledger region of ", region.size(), " bytes, ", need, " needed"));
  }
  std::memset(region.data(), 0, region_is_zero ? kLedgerHeaderBytes : need);
  Store<uint64_t>(region.data(), kMagic);
  Store<uint32_t>(region.data() + kCallSlotsOffset, call_slots);
  Store<uint32_t>(region.data() + kFinishedSlotsOffset, finished_slots);
  return absl::OkStatus();
}

absl::Status CheckLedgerFormat(absl::Span<const char> region,
                               uint32_t call_slots, uint32_t finished_slots) {
  if (region.size() < LedgerBytes(call_slots, finished_slots)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ledger region of ", region.size(), " bytes, ",
        LedgerBytes(call_slots, finished_slots), " needed"));
  }
  const auto calls = Load<uint32_t>(region.data() + kCallSlotsOffset);
  const auto finished = Load<uint32_t>(region.data() + kFinishedSlotsOffset);
  if (Load<uint64_t>(region.data()) != kMagic || calls != call_slots ||
      finished != finished_slots) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ledger holds ", calls, " call and ", finished,
        " finished slots (or none), this daemon's ", call_slots, " and ",
        finished_slots));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> LedgerClients::SlotOf(std::string_view client) {
  if (auto it = slots_.find(absl::string_view(client.data(), client.size()));
      it != slots_.end()) {
    return it->second;
  }
  if (clients_.size() >= kLedgerMaxClients) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "more than ", kLedgerMaxClients, " direct clients on one worker"));
  }
  const auto slot = static_cast<uint32_t>(clients_.size());
  clients_.emplace_back(client);
  slots_.emplace(std::string(client), slot);
  return slot;
}

const std::string* LedgerClients::ClientOf(uint32_t slot) const {
  return slot < clients_.size() ? &clients_[slot] : nullptr;
}

absl::StatusOr<std::unique_ptr<LedgerWriter>> LedgerWriter::Open(
    absl::Span<char> region) {
  if (region.size() < kLedgerHeaderBytes ||
      Load<uint64_t>(region.data()) != kMagic) {
    return absl::InvalidArgumentError("no ledger in the payload area");
  }
  const auto calls = Load<uint32_t>(region.data() + kCallSlotsOffset);
  const auto finished = Load<uint32_t>(region.data() + kFinishedSlotsOffset);
  if (calls > kLedgerMaxCallSlots || finished > kLedgerMaxFinishedSlots ||
      LedgerBytes(calls, finished) > region.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ledger header's counts (", calls, ", ", finished,
                     ") do not fit its ", region.size(), " bytes"));
  }
  return std::unique_ptr<LedgerWriter>(
      new LedgerWriter(region, calls, finished));
}

LedgerWriter::LedgerWriter(absl::Span<char> region, uint32_t call_slots,
                           uint32_t finished_slots)
    : region_(region),
      call_slots_(call_slots),
      finished_slots_(finished_slots) {
  free_.reserve(call_slots);
  // Lowest slots first: pages are touched only as the calls need them.
  for (uint32_t i = call_slots; i > 0; --i) free_.push_back(i - 1);
  populated_end_ = FinishedRing();
}

void LedgerWriter::PopulateAhead(const char* slot_end) {
  if (slot_end <= populated_end_) return;
  const char* ring_end = FinishedRing() + size_t{finished_slots_} * kLedgerFinishedSlotBytes;
  // From the slot's last byte (the bytes below are faulted in: by the last
  // step or by the writes before it). A kernel without MADV_POPULATE_WRITE:
  // the writes fault the pages in.
  const char* to = std::min(ring_end, slot_end + kLedgerPopulateBytes);
  base::PopulateCoveringForWrite(slot_end - 1, static_cast<size_t>(to - (slot_end - 1)));
  populated_end_ = to;
}

char* LedgerWriter::CallSlot(uint32_t slot) const {
  return region_.data() + kLedgerHeaderBytes +
         size_t{slot} * kLedgerCallSlotBytes;
}

char* LedgerWriter::FinishedRing() const {
  return region_.data() + kLedgerHeaderBytes + size_t{call_slots_} * kLedgerCallSlotBytes;
}

char* LedgerWriter::FinishedSlot(uint64_t index) const {
  return FinishedRing() + static_cast<size_t>(index % finished_slots_) * kLedgerFinishedSlotBytes;
}

std::optional<uint32_t> LedgerWriter::Started(uint32_t client_slot,
                                              std::string_view id) {
  absl::MutexLock lock(&mu_);
  if (free_.empty() || id.empty() || id.size() > kLedgerMaxIdBytes) {
    ++unrecorded_;
    return std::nullopt;
  }
  const uint32_t slot = free_.back();
  free_.pop_back();
  char* p = CallSlot(slot);
  Store<uint32_t>(p + 4, client_slot);
  Store<uint16_t>(p + 8, static_cast<uint16_t>(id.size()));
  std::memcpy(p + 16, id.data(), id.size());
  StoreState(p, static_cast<uint32_t>(LedgerState::kRunning));
  return slot;
}

void LedgerWriter::Retained(uint32_t slot) {
  if (slot >= call_slots_) return;
  StoreState(CallSlot(slot), static_cast<uint32_t>(LedgerState::kRetained));
}

void LedgerWriter::Finished(uint32_t slot) {
  if (slot >= call_slots_) return;
  absl::MutexLock lock(&mu_);
  char* p = CallSlot(slot);
  const auto length = Load<uint16_t>(p + 8);
  if (finished_slots_ > 0 && length <= kLedgerFinishedIdBytes) {
    char* f = FinishedSlot(finished_count_);
    if (finished_count_ < finished_slots_) PopulateAhead(f + kLedgerFinishedSlotBytes);
    // Invalid while rewritten, so a death in between loses only this slot.
    StoreState(f, 0);
    Store<uint16_t>(f + 4, static_cast<uint16_t>(Load<uint32_t>(p + 4)));
    Store<uint8_t>(f + 6, static_cast<uint8_t>(length));
    std::memcpy(f + 8, p + 16, length);
    StoreState(f, kFinishedWritten);
    ++finished_count_;
    __atomic_store_n(reinterpret_cast<uint64_t*>(region_.data() +
                                                 kFinishedCountOffset),
                     finished_count_, __ATOMIC_RELEASE);
  } else {
    ++finished_too_long_;
  }
  // Freed after the id is in the ring: a death in between shows both, and
  // the reader prefers the live slot (its WorkerDied is the stronger fact).
  StoreState(p, static_cast<uint32_t>(LedgerState::kFree));
  free_.push_back(slot);
}

void LedgerWriter::Forget(uint32_t slot) {
  if (slot >= call_slots_) return;
  absl::MutexLock lock(&mu_);
  StoreState(CallSlot(slot), static_cast<uint32_t>(LedgerState::kFree));
  free_.push_back(slot);
}

uint64_t LedgerWriter::unrecorded() const {
  absl::MutexLock lock(&mu_);
  return unrecorded_;
}

uint64_t LedgerWriter::finished_too_long() const {
  absl::MutexLock lock(&mu_);
  return finished_too_long_;
}

absl::StatusOr<LedgerContents> ReadLedger(absl::Span<const char> region,
                                          uint32_t call_slots,
                                          uint32_t finished_slots,
                                          const LedgerClients& clients) {
  if (call_slots > kLedgerMaxCallSlots ||
      finished_slots > kLedgerMaxFinishedSlots ||
      region.size() < LedgerBytes(call_slots, finished_slots)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ledger region of ", region.size(), " bytes is shorter than ",
        call_slots, " call slots and ", finished_slots, " finished slots"));
  }
  LedgerContents out;
  const char* calls = region.data() + kLedgerHeaderBytes;
  char slot[kLedgerCallSlotBytes];
  for (uint32_t i = 0; i < call_slots; ++i) {
    // A copy first: the bytes are looked at once, whatever the peer does.
    std::memcpy(slot, calls + size_t{i} * kLedgerCallSlotBytes, sizeof slot);
    const auto state = Load<uint32_t>(slot);
    if (state == static_cast<uint32_t>(LedgerState::kFree)) continue;
    const auto length = Load<uint16_t>(slot + 8);
    const std::string* client = clients.ClientOf(Load<uint32_t>(slot + 4));
    if ((state != static_cast<uint32_t>(LedgerState::kRunning) &&
         state != static_cast<uint32_t>(LedgerState::kRetained)) ||
        client == nullptr || length == 0 || length > kLedgerMaxIdBytes) {
      ++out.skipped;
      continue;
    }
    out.calls.push_back(
        LedgerCall{*client, std::string(slot + 16, length),
                   state == static_cast<uint32_t>(LedgerState::kRunning)});
  }
  // The ring from its oldest slot: the writer's count says where that is,
  // but it is untrusted too; any start gives the same set, only the order
  // (which FinishedIds evicts first) would differ.
  const char* ring = calls + size_t{call_slots} * kLedgerCallSlotBytes;
  const uint64_t count =
      Load<uint64_t>(region.data() + kFinishedCountOffset);
  const uint64_t start = finished_slots == 0 ? 0 : count % finished_slots;
  char entry[kLedgerFinishedSlotBytes];
  for (uint32_t k = 0; k < finished_slots; ++k) {
    const uint64_t i = (start + k) % finished_slots;
    std::memcpy(entry, ring + i * kLedgerFinishedSlotBytes, sizeof entry);
    const auto state = Load<uint32_t>(entry);
    if (state == 0) continue;
    const auto length = Load<uint8_t>(entry + 6);
    const std::string* client = clients.ClientOf(Load<uint16_t>(entry + 4));
    if (state != kFinishedWritten || client == nullptr || length == 0 ||
        length > kLedgerFinishedIdBytes) {
      ++out.skipped;
      continue;
    }
    out.finished.push_back(
        LedgerFinished{*client, std::string(entry + 8, length)});
  }
  return out;
}

}  // namespace agentix::ipc
