#include "worker/ipc/ledger.h"

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "testing/resident_pages.h"
#include "testing/status_matchers.h"

namespace agentix::ipc {
namespace {

constexpr uint32_t kCalls = 8;
constexpr uint32_t kFinished = 4;

struct Fixture {
  std::vector<char> region = std::vector<char>(LedgerBytes(kCalls, kFinished));
  LedgerClients clients;
  std::unique_ptr<LedgerWriter> writer;

  Fixture() {
    REQUIRE(FormatLedger(absl::MakeSpan(region), kCalls, kFinished).ok());
    auto opened = LedgerWriter::Open(absl::MakeSpan(region));
    REQUIRE(opened.ok());
    writer = std::move(*opened);
  }
  LedgerContents Read() {
    auto read = ReadLedger(absl::MakeConstSpan(region), kCalls, kFinished,
                           clients);
    REQUIRE(read.ok());
    return *std::move(read);
  }
  char* CallSlot(uint32_t i) {
    return region.data() + kLedgerHeaderBytes + i * kLedgerCallSlotBytes;
  }
  char* FinishedSlot(uint32_t i) {
    return region.data() + kLedgerHeaderBytes + kCalls * kLedgerCallSlotBytes +
           i * kLedgerFinishedSlotBytes;
  }
};

TEST_CASE("ledger: running, retained and finished calls read back") {
  Fixture f;
  const uint32_t alice = *f.clients.SlotOf("alice");
  const uint32_t bob = *f.clients.SlotOf("bob");
  CHECK(*f.clients.SlotOf("alice") == alice);
  auto a = f.writer->Started(alice, "call-a");
  auto b = f.writer->Started(bob, "call-b");
  auto c = f.writer->Started(alice, "call-c");
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  REQUIRE(c.has_value());
  f.writer->Retained(*b);
  f.writer->Retained(*c);
  f.writer->Finished(*c);

  const LedgerContents read = f.Read();
  CHECK(read.skipped == 0);
  REQUIRE(read.calls.size() == 2);
  bool saw_a = false, saw_b = false;
  for (const LedgerCall& call : read.calls) {
    if (call.id == "call-a") {
      saw_a = true;
      CHECK(call.client == "alice");
      CHECK(call.running);
    } else {
      saw_b = true;
      CHECK(call.id == "call-b");
      CHECK(call.client == "bob");
      CHECK_FALSE(call.running);
    }
  }
  CHECK((saw_a && saw_b));
  REQUIRE(read.finished.size() == 1);
  CHECK(read.finished[0].client == "alice");
  CHECK(read.finished[0].id == "call-c");
}

TEST_CASE("ledger: slots are reused and the finished ring keeps the newest") {
  Fixture f;
  const uint32_t client = *f.clients.SlotOf("");
  for (int i = 0; i < 100; ++i) {
    auto slot = f.writer->Started(client, "id-" + std::to_string(i));
    REQUIRE(slot.has_value());
    f.writer->Retained(*slot);
    f.writer->Finished(*slot);
  }
  const LedgerContents read = f.Read();
  CHECK(read.calls.empty());
  REQUIRE(read.finished.size() == kFinished);
  for (uint32_t k = 0; k < kFinished; ++k) {
    CHECK(read.finished[k].id == "id-" + std::to_string(100 - kFinished + k));
    CHECK(read.finished[k].client.empty());
  }
}

TEST_CASE("ledger: a full ledger and over-long ids are counted, not written") {
  Fixture f;
  const uint32_t client = *f.clients.SlotOf("c");
  for (uint32_t i = 0; i < kCalls; ++i) {
    REQUIRE(f.writer->Started(client, "x" + std::to_string(i)).has_value());
  }
  CHECK_FALSE(f.writer->Started(client, "one-more").has_value());
  CHECK_FALSE(f.writer->Started(client, "").has_value());
  CHECK(f.writer->unrecorded() == 2);

  Fixture g;
  const uint32_t h = *g.clients.SlotOf("h");
  CHECK_FALSE(
      g.writer->Started(h, std::string(kLedgerMaxIdBytes + 1, 'z')).has_value());
  // Fits a call slot, not the finished ring: live while it runs, then gone.
  auto slot = g.writer->Started(h, std::string(kLedgerFinishedIdBytes + 1, 'y'));
  REQUIRE(slot.has_value());
  CHECK(g.Read().calls.size() == 1);
  g.writer->Finished(*slot);
  CHECK(g.writer->finished_too_long() == 1);
  const LedgerContents read = g.Read();
  CHECK(read.calls.empty());
  CHECK(read.finished.empty());
}

TEST_CASE("ledger: unknown client slots, bad states and lengths are skipped") {
  Fixture f;
  const uint32_t client = *f.clients.SlotOf("known");
  REQUIRE(f.writer->Started(client, "good").has_value());
  auto other = f.writer->Started(client, "other");
  REQUIRE(other.has_value());
  f.writer->Finished(*other);

  uint32_t unknown_client = 7;
  std::memcpy(f.CallSlot(2), "\x01\0\0\0", 4);
  std::memcpy(f.CallSlot(2) + 4, &unknown_client, 4);
  const uint16_t length = 3;
  std::memcpy(f.CallSlot(2) + 8, &length, 2);
  std::memcpy(f.CallSlot(3), "\x09\0\0\0", 4);  // no such state
  std::memcpy(f.CallSlot(4), "\x02\0\0\0", 4);  // retained, id length 0
  const uint16_t too_long = kLedgerMaxIdBytes + 1;
  std::memcpy(f.CallSlot(5), "\x01\0\0\0", 4);
  std::memcpy(f.CallSlot(5) + 8, &too_long, 2);
  std::memcpy(f.FinishedSlot(1), "\x01\0\0\0\x05\0\x03\0abc", 11);  // client 5
  std::memcpy(f.FinishedSlot(2), "\x01\0\0\0\0\0\xff\0", 8);  // length 255
  std::memcpy(f.FinishedSlot(3), "\x03\0\0\0\0\0\x01\0z", 9);  // bad state

  const LedgerContents read = f.Read();
  CHECK(read.skipped == 7);
  REQUIRE(read.calls.size() == 1);
  CHECK(read.calls[0].id == "good");
  REQUIRE(read.finished.size() == 1);
  CHECK(read.finished[0].id == "other");
}

TEST_CASE("ledger: random bytes never produce entries past the bounds") {
  std::mt19937_64 rng(38);
  LedgerClients clients;
  REQUIRE(clients.SlotOf("a").ok());
  REQUIRE(clients.SlotOf("b").ok());
  std::vector<char> region(LedgerBytes(kCalls, kFinished));
  for (int round = 0; round < 200; ++round) {
    for (char& c : region) {
      // Small values often, so some states and client slots look valid.
      const uint64_t r = rng();
      c = static_cast<char>((r & 3) == 0 ? r >> 8 : (r >> 8) & 3);
    }
    auto read = ReadLedger(absl::MakeConstSpan(region), kCalls, kFinished,
                           clients);
    REQUIRE(read.ok());
    CHECK(read->calls.size() + read->skipped <= kCalls + kFinished);
    for (const LedgerCall& call : read->calls) {
      CHECK((call.client == "a" || call.client == "b"));
      CHECK(!call.id.empty());
      CHECK(call.id.size() <= kLedgerMaxIdBytes);
    }
    for (const LedgerFinished& done : read->finished) {
      CHECK(!done.id.empty());
      CHECK(done.id.size() <= kLedgerFinishedIdBytes);
    }
    // The writer refuses a header whose counts do not fit its region.
    auto writer = LedgerWriter::Open(absl::MakeSpan(region));
    CHECK_FALSE(writer.ok());
  }
}

TEST_CASE("ledger: short regions and counts over the bounds are refused") {
  LedgerClients clients;
  std::vector<char> region(LedgerBytes(kCalls, kFinished) - 1);
  CHECK_FALSE(FormatLedger(absl::MakeSpan(region), kCalls, kFinished).ok());
  CHECK_FALSE(
      ReadLedger(absl::MakeConstSpan(region), kCalls, kFinished, clients).ok());
  CHECK_FALSE(ReadLedger(absl::MakeConstSpan(region), kLedgerMaxCallSlots + 1,
                         0, clients)
                  .ok());
  // A header claiming more slots than its region holds.
  std::vector<char> big(LedgerBytes(kCalls, kFinished));
  REQUIRE(FormatLedger(absl::MakeSpan(big), kCalls, kFinished).ok());
  const uint32_t lie = kCalls * 1000;
  std::memcpy(big.data() + 8, &lie, 4);
  CHECK_FALSE(LedgerWriter::Open(absl::MakeSpan(big)).ok());
}

TEST_CASE("ledger: client slots are bounded") {
  LedgerClients clients;
  for (uint32_t i = 0; i < kLedgerMaxClients; ++i) {
    REQUIRE(*clients.SlotOf("c" + std::to_string(i)) == i);
  }
  CHECK(clients.SlotOf("one-more").status().code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK(*clients.SlotOf("c0") == 0);
  CHECK(clients.ClientOf(kLedgerMaxClients) == nullptr);
}

TEST_CASE("ledger: an adopted worker's ledger is checked against the daemon's counts") {
  std::vector<char> region(LedgerBytes(kCalls, kFinished));
  // Never formatted: no ledger.
  CHECK(absl::IsFailedPrecondition(
      CheckLedgerFormat(absl::MakeConstSpan(region), kCalls, kFinished)));
  REQUIRE(FormatLedger(absl::MakeSpan(region), kCalls, kFinished).ok());
  CHECK(CheckLedgerFormat(absl::MakeConstSpan(region), kCalls, kFinished).ok());
  CHECK(absl::IsFailedPrecondition(
      CheckLedgerFormat(absl::MakeConstSpan(region), kCalls - 1, kFinished)));
  CHECK(absl::IsFailedPrecondition(
      CheckLedgerFormat(absl::MakeConstSpan(region), kCalls, kFinished + 1)));
  // A region too short for the daemon's counts.
  CHECK(absl::IsFailedPrecondition(
      CheckLedgerFormat(absl::MakeConstSpan(region), kCalls * 2, kFinished)));
}

TEST_CASE("ledger: a zero region is formatted by its header alone") {
  std::vector<char> region(LedgerBytes(kCalls, kFinished), '\xab');
  REQUIRE(FormatLedger(absl::MakeSpan(region), kCalls, kFinished,
                       /*region_is_zero=*/true).ok());
  CHECK(CheckLedgerFormat(absl::MakeConstSpan(region), kCalls, kFinished).ok());
  // The slots were not touched (a fresh memfd's pages stay unfaulted).
  CHECK(region[kLedgerHeaderBytes] == '\xab');
  CHECK(region.back() == '\xab');
  REQUIRE(FormatLedger(absl::MakeSpan(region), kCalls, kFinished).ok());
  CHECK(region[kLedgerHeaderBytes] == 0);
  CHECK(region.back() == 0);

  std::vector<char> zero(LedgerBytes(kCalls, kFinished), 0);
  REQUIRE(FormatLedger(absl::MakeSpan(zero), kCalls, kFinished, /*region_is_zero=*/true).ok());
  LedgerClients clients;
  auto read = ReadLedger(absl::MakeConstSpan(zero), kCalls, kFinished, clients);
  REQUIRE(read.ok());
  CHECK(read->calls.empty());
  CHECK(read->finished.empty());
  CHECK(read->skipped == 0);
}

// Pages of [begin, end) in memory.
size_t ResidentPages(const char* begin, const char* end) {
  return agentix::testing::ResidentPages(begin, static_cast<size_t>(end - begin));
}

TEST_CASE("ledger: the finished ring's first pass faults its pages in ahead, a step at a time") {
  // As the daemon makes it: a fresh memfd, shared, formatted by its header.
  constexpr uint32_t kRingCalls = 4096;  // the daemon's default call slots
  constexpr uint32_t kRingFinished = 4096;
  const size_t bytes = LedgerBytes(kRingCalls, kRingFinished);
  const int fd = memfd_create("ledger-test", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, static_cast<off_t>(bytes)) == 0);
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  REQUIRE(mapped != MAP_FAILED);
  const absl::Span<char> region(static_cast<char*>(mapped), bytes);
  REQUIRE(FormatLedger(region, kRingCalls, kRingFinished, /*region_is_zero=*/true).ok());
  auto writer = LedgerWriter::Open(region);
  REQUIRE(writer.ok());

  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const char* ring = region.data() + kLedgerHeaderBytes + kRingCalls * kLedgerCallSlotBytes;
  const char* ring_end = ring + kRingFinished * kLedgerFinishedSlotBytes;
  auto ring_page = [&](size_t offset) {
    return reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(ring + offset) & ~(page - 1));
  };
  auto finish_one = [&](uint64_t i) {
    const auto slot = (*writer)->Started(0, absl::StrCat("call-", i));
    REQUIRE(slot.has_value());
    (*writer)->Finished(*slot);
  };
  CHECK(ResidentPages(ring_page(0), ring_page(kLedgerPopulateBytes)) == 0);
  finish_one(0);
  // The first id's write, and the step's pages after it.
  const size_t step_pages = kLedgerPopulateBytes / page;
  CHECK(ResidentPages(ring_page(0), ring_page(kLedgerPopulateBytes)) == step_pages);
  CHECK(ResidentPages(ring_page(kLedgerPopulateBytes) + 2 * page,
                      ring_page(2 * kLedgerPopulateBytes)) == 0);
  // Writes past the first step's pages: the pages well ahead of them are in
  // memory before any write reaches them.
  const uint64_t past = (kLedgerPopulateBytes + 2 * page) / kLedgerFinishedSlotBytes + 1;
  for (uint64_t i = 1; i <= past; ++i) finish_one(i);
  const size_t written = past * kLedgerFinishedSlotBytes + kLedgerFinishedSlotBytes;
  const char* ahead = ring_page(written) + 2 * page;
  CHECK(ResidentPages(ahead, ahead + step_pages / 2 * page) == step_pages / 2);
  for (uint64_t i = past + 1; i < kRingFinished + 10; ++i) finish_one(i);
  // To the end and round again: the ids are all there, newest kept.
  const size_t ring_pages =
      agentix::testing::PagesTouched(ring_page(0), static_cast<size_t>(ring_end - ring_page(0)));
  CHECK(ResidentPages(ring_page(0), ring_end) == ring_pages);
  LedgerClients clients;
  REQUIRE(clients.SlotOf("alice").ok());
  auto read = ReadLedger(region, kRingCalls, kRingFinished, clients);
  REQUIRE(read.ok());
  REQUIRE(read->finished.size() == kRingFinished);
  CHECK(read->finished.front().id == absl::StrCat("call-", 10));
  CHECK(read->finished.back().id == absl::StrCat("call-", kRingFinished + 9));
  munmap(mapped, bytes);
}

}  // namespace
}  // namespace agentix::ipc
