#include "worker/ipc/payload_area.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/fresh_pages.h"
#include "base/payload_copy.h"

namespace agentix::ipc {
namespace {

// Header page: magic, ring size, then each ring's release counter on its own
// cache line.
constexpr size_t kHeaderBytes = 4096;
constexpr uint64_t kMagic = 0x314c594150584741ull;  // "AGXPAYL1"
constexpr size_t kMagicOffset = 0;
constexpr size_t kRingBytesOffset = 8;
// The ledger's bytes after the rings (0: none, as in an area made before
// stop 38 or by a frame-wire host).
constexpr size_t kLedgerBytesOffset = 16;
// "To worker": the creator's outgoing ring; "to daemon": the mapper's.
constexpr size_t kToWorkerReleasedOffset = 64;   // written by the mapper
constexpr size_t kToDaemonReleasedOffset = 128;  // written by the creator
constexpr size_t kWaitCpuOffset = 192;           // written by the creator
// Direct calls' counters (docs/DIRECT-CALLS.md), written by the mapper.
constexpr size_t kDirectRunningOffset = 256;
constexpr size_t kDirectLastEndOffset = 320;
constexpr size_t kPageBytes = 4096;

uint64_t* Word(char* base, size_t offset) {
  return reinterpret_cast<uint64_t*>(base + offset);
}

}  // namespace

PayloadArea::PayloadArea(Side side, int fd, char* base, size_t map_bytes,
                         size_t ring_bytes)
    : side_(side),
      fd_(fd),
      base_(base),
      map_bytes_(map_bytes),
      ring_bytes_(ring_bytes),
      ledger_bytes_(map_bytes - kHeaderBytes - 2 * ring_bytes) {
  char* to_worker = base_ + kHeaderBytes;
  char* to_daemon = to_worker + ring_bytes_;
  const bool daemon = side_ == Side::kCreator;  // the creator's view
  out_ring_ = daemon ? to_worker : to_daemon;
  in_ring_ = daemon ? to_daemon : to_worker;
  out_released_ =
      Word(base_, daemon ? kToWorkerReleasedOffset : kToDaemonReleasedOffset);
  in_released_ =
      Word(base_, daemon ? kToDaemonReleasedOffset : kToWorkerReleasedOffset);
  static_assert(std::atomic<int32_t>::is_always_lock_free);
  wait_cpu_ = reinterpret_cast<std::atomic<int32_t>*>(base_ + kWaitCpuOffset);
  static_assert(std::atomic<int64_t>::is_always_lock_free);
  direct_running_ =
      reinterpret_cast<std::atomic<int64_t>*>(base_ + kDirectRunningOffset);
  direct_last_end_ns_ =
      reinterpret_cast<std::atomic<int64_t>*>(base_ + kDirectLastEndOffset);
}

absl::Span<char> PayloadArea::Ledger() const {
  return absl::MakeSpan(base_ + kHeaderBytes + 2 * ring_bytes_, ledger_bytes_);
}

void PayloadArea::AddDirectRunning(int64_t delta) {
  direct_running_->fetch_add(delta, std::memory_order_relaxed);
}

void PayloadArea::PublishDirectCallEnd(int64_t monotonic_ns) {
  direct_last_end_ns_->store(monotonic_ns, std::memory_order_relaxed);
}

int64_t PayloadArea::DirectRunning() const {
  return std::max<int64_t>(0, direct_running_->load(std::memory_order_relaxed));
}

int64_t PayloadArea::DirectLastEndNs() const {
  return std::max<int64_t>(
      0, direct_last_end_ns_->load(std::memory_order_relaxed));
}

void PayloadArea::PublishWaitCpu(int cpu) {
  wait_cpu_->store(cpu < 0 ? 0 : cpu + 1, std::memory_order_relaxed);
}

int PayloadArea::WaitCpu() const {
  return wait_cpu_->load(std::memory_order_relaxed) - 1;
}

absl::StatusOr<std::unique_ptr<PayloadArea>> PayloadArea::Create(
    size_t ring_bytes, bool sealed, size_t ledger_bytes) {
  ring_bytes = (ring_bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
  ledger_bytes = (ledger_bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
  if (ring_bytes == 0) {
    return absl::InvalidArgumentError("payload ring size must not be zero");
  }
  const int fd = ::memfd_create(
      "agentix-payloads", MFD_CLOEXEC | (sealed ? MFD_ALLOW_SEALING : 0u));
  if (fd < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("memfd_create: ", strerror(errno)));
  }
  const size_t map_bytes = kHeaderBytes + 2 * ring_bytes + ledger_bytes;
  if (::ftruncate(fd, static_cast<off_t>(map_bytes)) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("ftruncate payload area: ", strerror(err)));
  }
  if (sealed &&
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("sealing payload area: ", strerror(err)));
  }
  void* base =
      ::mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap payload area: ", strerror(err)));
  }
  char* b = static_cast<char*>(base);
  *Word(b, kMagicOffset) = kMagic;
  *Word(b, kRingBytesOffset) = ring_bytes;
  *Word(b, kLedgerBytesOffset) = ledger_bytes;
  return std::unique_ptr<PayloadArea>(
      new PayloadArea(Side::kCreator, fd, b, map_bytes, ring_bytes));
}

absl::StatusOr<std::unique_ptr<PayloadArea>> PayloadArea::Map(int fd) {
  return MapAs(fd, Side::kMapper);
}

absl::StatusOr<std::unique_ptr<PayloadArea>> PayloadArea::AdoptCreated(int fd) {
  return MapAs(fd, Side::kCreator);
}

absl::StatusOr<std::unique_ptr<PayloadArea>> PayloadArea::MapAs(int fd,
                                                               Side side) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload area fd ", fd, ": ", strerror(errno)));
  }
  const size_t map_bytes = static_cast<size_t>(st.st_size);
  if (map_bytes < kHeaderBytes + 2 * kPageBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload area fd ", fd, " is too small (", map_bytes, " bytes)"));
  }
  void* base =
      ::mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    return absl::InvalidArgumentError(
        absl::StrCat("mmap payload area: ", strerror(errno)));
  }
  char* b = static_cast<char*>(base);
  const uint64_t ring_bytes = *Word(b, kRingBytesOffset);
  const uint64_t ledger_bytes = *Word(b, kLedgerBytesOffset);
  // Each term bounded by the mapping first, so the sum cannot wrap.
  if (*Word(b, kMagicOffset) != kMagic || ring_bytes == 0 ||
      ring_bytes % kPageBytes != 0 || ring_bytes > map_bytes ||
      ledger_bytes > map_bytes ||
      kHeaderBytes + 2 * ring_bytes + ledger_bytes != map_bytes) {
    ::munmap(base, map_bytes);
    return absl::InvalidArgumentError(
        absl::StrCat("fd ", fd, " does not hold a payload area"));
  }
  return std::unique_ptr<PayloadArea>(
      new PayloadArea(side, side == Side::kCreator ? fd : -1, b, map_bytes,
                      static_cast<size_t>(ring_bytes)));
}

absl::StatusOr<std::unique_ptr<PayloadArea>> PayloadArea::MapSealed(int fd) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload area fd ", fd, " is not a sealable memfd: ", strerror(errno)));
  }
  if ((seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload area fd ", fd, " is not sealed against shrinking (F_SEAL_SHRINK)"));
  }
  return Map(fd);
}

PayloadArea::~PayloadArea() {
  ::munmap(base_, map_bytes_);
  CloseFd();
}

void PayloadArea::CloseFd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::optional<uint64_t> PayloadArea::Put(std::string_view data) {
  return Put(absl::MakeConstSpan(&data, 1));
}

std::optional<uint64_t> PayloadArea::Put(
    absl::Span<const std::string_view> parts) {
  uint64_t size = 0;
  for (std::string_view part : parts) size += part.size();
  if (size == 0 || size > ring_bytes_) return std::nullopt;
  const uint64_t released = __atomic_load_n(out_released_, __ATOMIC_ACQUIRE);
  // The peer writes `released`: anything but a position between what it
  // could have seen and our tail means garbage, and garbage means "no room".
  // Before out_floor_ everything is free (see below).
  const uint64_t free_from = std::max(released, out_floor_);
  if (released > out_tail_ || out_tail_ - free_from > ring_bytes_) {
    return std::nullopt;
  }
  uint64_t pos = out_tail_;
  const uint64_t at = pos % ring_bytes_;
  if (released == out_tail_) {
    // Empty: start again at the ring's start, so payloads that are taken
    // out as fast as they come (most) keep reusing the same pages, already
    // faulted in and likely cached, instead of walking all of them. The
    // bytes skipped are free although the peer's counter stays below them
    // until it releases this piece.
    if (at != 0) pos += ring_bytes_ - at;
    out_floor_ = pos;
  } else {
    if (at + size > ring_bytes_) pos += ring_bytes_ - at;  // never wraps
    if (pos + size - free_from > ring_bytes_) return std::nullopt;
  }
  const uint64_t offset = pos % ring_bytes_;
  char* out = out_ring_ + offset;
  // The ring's pages from out_fresh_at_ on have never been written (a put
  // never starts past it: pieces follow each other and restart at 0). Filled
  // at once they cost about a third of a fault a page here (a 16 MiB
  // result's first put: ~70 ms of faults; docs/PERFORMANCE.md "stop-65: a
  // sandbox's first large echo"); a few pages are left to the copy.
  const uint64_t end = offset + size;
  if (end > out_fresh_at_) {
    if (end - out_fresh_at_ >= kPopulateMinBytes) {
      (void)base::PopulateFreshForWrite(out_ring_ + out_fresh_at_,
                                        end - out_fresh_at_);
      populated_bytes_ += end - out_fresh_at_;
    }
    out_fresh_at_ = end;
  }
  for (std::string_view part : parts) {
    if (part.empty()) continue;
    base::CopyPayload(out, part.data(), part.size());
    out += part.size();
  }
  out_tail_ = pos + size;
  return pos;
}

absl::StatusOr<std::string_view> PayloadArea::Get(uint64_t pos,
                                                  uint64_t size) const {
  if (size == 0 || size > ring_bytes_ ||
      pos % ring_bytes_ + size > ring_bytes_ || pos < in_done_ ||
      pos > UINT64_MAX - size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload piece at ", pos, " (", size, " bytes) is outside the ",
        ring_bytes_, "-byte ring or already released"));
  }
  return std::string_view(in_ring_ + pos % ring_bytes_,
                          static_cast<size_t>(size));
}

void PayloadArea::Release(uint64_t end) {
  if (end <= in_done_) return;
  in_done_ = end;
  __atomic_store_n(in_released_, end, __ATOMIC_RELEASE);
}

}  // namespace agentix::ipc
