#include "worker/ipc/payload_area.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "testing/status_matchers.h"

namespace agentix::ipc {
namespace {

struct Pair {
  std::unique_ptr<PayloadArea> daemon;
  std::unique_ptr<PayloadArea> worker;
};

Pair MakePair(size_t ring_bytes) {
  auto daemon = PayloadArea::Create(ring_bytes);
  REQUIRE(daemon.ok());
  auto worker = PayloadArea::Map((*daemon)->fd());
  REQUIRE(worker.ok());
  (*daemon)->CloseFd();
  return {std::move(*daemon), std::move(*worker)};
}

std::string Bytes(size_t n, char seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 7);
  return s;
}

TEST_CASE("Pieces cross both rings in order", "[ipc][payload]") {
  Pair p = MakePair(64 * 1024);
  REQUIRE(p.daemon->ring_bytes() == 64 * 1024);
  REQUIRE(p.worker->ring_bytes() == 64 * 1024);
  const std::string a = Bytes(20000, 'a'), b = Bytes(30000, 'b');
  auto pa = p.daemon->Put(a);
  auto pb = p.daemon->Put(b);
  REQUIRE(pa.has_value());
  REQUIRE(pb.has_value());
  auto va = p.worker->Get(*pa, a.size());
  auto vb = p.worker->Get(*pb, b.size());
  REQUIRE(va.ok());
  REQUIRE(vb.ok());
  CHECK(*va == a);
  CHECK(*vb == b);
  p.worker->Release(*pb + b.size());
  // The other direction is independent.
  const std::string c = Bytes(1000, 'c');
  auto pc = p.worker->Put(c);
  REQUIRE(pc.has_value());
  CHECK(*pc == 0);
  auto vc = p.daemon->Get(*pc, c.size());
  REQUIRE(vc.ok());
  CHECK(*vc == c);
}

TEST_CASE("A full ring refuses until the consumer releases; pieces never wrap",
          "[ipc][payload]") {
  Pair p = MakePair(64 * 1024);
  const std::string piece = Bytes(24 * 1024, 'x');
  auto first = p.daemon->Put(piece);
  auto second = p.daemon->Put(piece);
  REQUIRE(first.has_value());
  REQUIRE(second.has_value());
  // 48 KiB used: a third 24 KiB piece would wrap, so it must skip to the
  // ring's start, which is still in use.
  CHECK_FALSE(p.daemon->Put(piece).has_value());
  p.worker->Release(*first + piece.size());
  auto third = p.daemon->Put(piece);
  REQUIRE(third.has_value());
  CHECK(*third == 64 * 1024);  // the ring's start, one lap on
  auto view = p.worker->Get(*third, piece.size());
  REQUIRE(view.ok());
  CHECK(*view == piece);
  // Too big for the ring at all, and empty: inline.
  CHECK_FALSE(p.daemon->Put(Bytes(65 * 1024, 'y')).has_value());
  CHECK_FALSE(p.daemon->Put("").has_value());
}

TEST_CASE("An empty ring takes the next piece at its start",
          "[ipc][payload]") {
  Pair p = MakePair(64 * 1024);
  const std::string piece = Bytes(40 * 1024, 'e');
  auto first = p.daemon->Put(piece);
  REQUIRE(first.has_value());
  CHECK(*first == 0);
  auto view = p.worker->Get(*first, piece.size());
  REQUIRE(view.ok());
  p.worker->Release(*first + piece.size());
  // Everything released: the next piece reuses the ring's first pages
  // (one lap on) instead of following the last one, even where the last
  // one's end would have left it room.
  for (uint64_t lap = 1; lap <= 3; ++lap) {
    auto next = p.daemon->Put(Bytes(1000, 'f'));
    REQUIRE(next.has_value());
    CHECK(*next == lap * 64 * 1024);
    auto got = p.worker->Get(*next, 1000);
    REQUIRE(got.ok());
    CHECK(*got == Bytes(1000, 'f'));
    p.worker->Release(*next + 1000);
  }
  // Pieces put while others are unreleased follow them as before, and the
  // bytes skipped to restart do not count as used: the whole ring fills.
  auto a = p.daemon->Put(Bytes(1000, 'g'));
  REQUIRE(a.has_value());
  CHECK(*a == 4 * 64 * 1024);
  auto b = p.daemon->Put(Bytes(63 * 1024, 'h'));
  REQUIRE(b.has_value());
  CHECK(*b == *a + 1000);
  CHECK_FALSE(p.daemon->Put(Bytes(1024, 'i')).has_value());  // full
  p.worker->Release(*a + 1000);
  auto c = p.daemon->Put(Bytes(1000, 'j'));  // wraps to the start again
  REQUIRE(c.has_value());
  CHECK(*c == 5 * 64 * 1024);
  CHECK(*p.worker->Get(*b, 63 * 1024) == Bytes(63 * 1024, 'h'));
}

TEST_CASE("The worker sees the daemon's wait CPU", "[ipc][payload]") {
  Pair p = MakePair(4096);
  CHECK(p.worker->WaitCpu() == -1);  // a fresh area: no CPU
  p.daemon->PublishWaitCpu(1);
  CHECK(p.worker->WaitCpu() == 1);
  p.daemon->PublishWaitCpu(0);
  CHECK(p.worker->WaitCpu() == 0);
  p.daemon->PublishWaitCpu(-1);  // the daemon unpinned its call path
  CHECK(p.worker->WaitCpu() == -1);
}

TEST_CASE("The daemon sees the worker's direct-call counters",
          "[ipc][payload]") {
  Pair p = MakePair(4096);
  CHECK(p.daemon->DirectRunning() == 0);
  CHECK(p.daemon->DirectLastEndNs() == 0);
  p.worker->AddDirectRunning(1);
  p.worker->AddDirectRunning(1);
  CHECK(p.daemon->DirectRunning() == 2);
  p.worker->AddDirectRunning(-1);
  p.worker->PublishDirectCallEnd(123456789);
  CHECK(p.daemon->DirectRunning() == 1);
  CHECK(p.daemon->DirectLastEndNs() == 123456789);
  // A worker's garbage never reads as a negative count or time.
  p.worker->AddDirectRunning(-5);
  p.worker->PublishDirectCallEnd(-7);
  CHECK(p.daemon->DirectRunning() == 0);
  CHECK(p.daemon->DirectLastEndNs() == 0);
}

TEST_CASE("A ledger region follows the rings and both sides see it",
          "[ipc][payload]") {
  auto none = PayloadArea::Create(4096);
  REQUIRE(none.ok());
  CHECK((*none)->Ledger().empty());

  auto daemon = PayloadArea::Create(4096, /*sealed=*/false, 5000);
  REQUIRE(daemon.ok());
  CHECK((*daemon)->Ledger().size() == 8192);  // whole pages
  auto worker = PayloadArea::Map((*daemon)->fd());
  REQUIRE(worker.ok());
  REQUIRE((*worker)->Ledger().size() == 8192);
  (*worker)->Ledger()[8191] = 'x';
  CHECK((*daemon)->Ledger()[8191] == 'x');
  // The rings are unchanged by it.
  const std::string a = Bytes(1000, 'a');
  auto pos = (*daemon)->Put(a);
  REQUIRE(pos.has_value());
  CHECK((*worker)->Get(*pos, a.size()).value() == a);
}

TEST_CASE("Map refuses a header whose ledger size does not match the file",
          "[ipc][payload]") {
  auto daemon = PayloadArea::Create(4096, /*sealed=*/false, 4096);
  REQUIRE(daemon.ok());
  // The header's ledger size (offset 16) as a peer could scribble it.
  for (uint64_t lie : {uint64_t{0}, uint64_t{8192}, ~uint64_t{0}}) {
    REQUIRE(::pwrite((*daemon)->fd(), &lie, sizeof lie, 16) == sizeof lie);
    CHECK(PayloadArea::Map((*daemon)->fd()).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("Put fills only ring pages no put reached before, large runs of them",
          "[ipc][payload]") {
  constexpr size_t kMin = PayloadArea::kPopulateMinBytes;
  Pair p = MakePair(4 * kMin);
  // A first large piece: its pages are all fresh.
  const std::string big = Bytes(kMin + 4096, 'b');
  auto first = p.daemon->Put(big);
  REQUIRE(first.has_value());
  CHECK(p.daemon->populated_bytes() == big.size());
  // The ring empties and restarts at its start: those pages are not fresh.
  p.worker->Release(*first + big.size());
  auto again = p.daemon->Put(big);
  REQUIRE(again.has_value());
  CHECK(*again % p.daemon->ring_bytes() == 0);
  CHECK(p.daemon->populated_bytes() == big.size());
  // A small piece past them: too few fresh bytes to fill, left to the copy.
  const std::string small = Bytes(8192, 's');
  auto past = p.daemon->Put(small);
  REQUIRE(past.has_value());
  CHECK(p.daemon->populated_bytes() == big.size());
  // The next large one fills only what is fresh after that piece.
  const std::string next = Bytes(kMin, 'n');
  auto after = p.daemon->Put(next);
  REQUIRE(after.has_value());
  CHECK(p.daemon->populated_bytes() == big.size() + next.size());
  // Every piece reads back whole on the other side.
  for (auto [pos, bytes] : {std::pair{*again, &big}, {*past, &small}, {*after, &next}}) {
    auto view = p.worker->Get(pos, bytes->size());
    REQUIRE(view.ok());
    CHECK(*view == *bytes);
  }
  // The other ring keeps its own mark.
  CHECK(p.worker->populated_bytes() == 0);
  REQUIRE(p.worker->Put(big).has_value());
  CHECK(p.worker->populated_bytes() == big.size());
}

TEST_CASE("Put gathers parts into one piece", "[ipc][payload]") {
  Pair p = MakePair(64 * 1024);
  const std::string a = Bytes(5000, 'a'), b = Bytes(7, 'b'),
                    c = Bytes(9000, 'c');
  const std::string_view parts[] = {a, "", b, c};
  auto pos = p.daemon->Put(parts);
  REQUIRE(pos.has_value());
  auto view = p.worker->Get(*pos, a.size() + b.size() + c.size());
  REQUIRE(view.ok());
  CHECK(*view == a + b + c);
  const std::string_view empty[] = {"", ""};
  CHECK_FALSE(p.daemon->Put(empty).has_value());
}

TEST_CASE("Bad references from the peer are refused", "[ipc][payload]") {
  Pair p = MakePair(64 * 1024);
  CHECK(p.worker->Get(0, 0).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK_FALSE(p.worker->Get(0, 65 * 1024).ok());
  CHECK_FALSE(p.worker->Get(60 * 1024, 8 * 1024).ok());  // would wrap
  CHECK_FALSE(p.worker->Get(UINT64_MAX - 10, 100).ok());
  p.worker->Release(4096);
  CHECK_FALSE(p.worker->Get(0, 100).ok());  // already released
  CHECK(p.worker->Get(4096, 100).ok());
}

TEST_CASE("A garbage release counter only makes Put fall back",
          "[ipc][payload]") {
  Pair p = MakePair(64 * 1024);
  // The worker claims to have released bytes that were never put.
  p.worker->Release(1u << 30);
  CHECK_FALSE(p.daemon->Put(Bytes(100, 'z')).has_value());
}

TEST_CASE("AdoptCreated takes the creator's side of an area another process made",
          "[ipc][payload]") {
  // The launcher's area: it creates it, the worker maps it, the daemon
  // (after the launcher's exec) adopts the creator's side from the fd.
  auto launcher = PayloadArea::Create(64 * 1024);
  REQUIRE(launcher.ok());
  auto worker = PayloadArea::Map((*launcher)->fd());
  REQUIRE(worker.ok());
  const int fd = ::dup((*launcher)->fd());
  launcher->reset();  // the launcher's image is gone; the fd stays
  auto daemon = PayloadArea::AdoptCreated(fd);
  REQUIRE(daemon.ok());
  CHECK((*daemon)->fd() == fd);
  CHECK((*daemon)->ring_bytes() == 64 * 1024);
  const std::string a = Bytes(20000, 'a'), c = Bytes(3000, 'c');
  auto pa = (*daemon)->Put(a);
  REQUIRE(pa.has_value());
  auto va = (*worker)->Get(*pa, a.size());
  REQUIRE(va.ok());
  CHECK(*va == a);
  auto pc = (*worker)->Put(c);
  REQUIRE(pc.has_value());
  auto vc = (*daemon)->Get(*pc, c.size());
  REQUIRE(vc.ok());
  CHECK(*vc == c);
  (*daemon)->CloseFd();
  CHECK((*daemon)->fd() == -1);

  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  CHECK(PayloadArea::AdoptCreated(fds[0]).status().code() ==
        absl::StatusCode::kInvalidArgument);
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST_CASE("Map refuses an fd that is not a payload area", "[ipc][payload]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  CHECK(PayloadArea::Map(fds[0]).status().code() ==
        absl::StatusCode::kInvalidArgument);
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST_CASE("MapSealed takes only an area sealed against shrinking",
          "[ipc][payload]") {
  auto unsealed = PayloadArea::Create(64 * 1024);
  REQUIRE(unsealed.ok());
  const absl::Status refused = PayloadArea::MapSealed((*unsealed)->fd()).status();
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(refused.message()).find("F_SEAL_SHRINK") != std::string::npos);

  auto sealed = PayloadArea::Create(256 * 1024, /*sealed=*/true);
  REQUIRE(sealed.ok());
  // The size is fixed: the creator cannot shrink it under a mapping.
  CHECK(::ftruncate((*sealed)->fd(), 4096) != 0);
  auto mapped = PayloadArea::MapSealed((*sealed)->fd());
  REQUIRE(mapped.ok());
  // The creator's outgoing ring is the mapper's incoming one, and back.
  const std::string a = Bytes(70000, 'a'), b = Bytes(90000, 'b');
  auto pa = (*sealed)->Put(a);
  REQUIRE(pa.has_value());
  CHECK((*mapped)->Get(*pa, a.size()).value() == a);
  auto pb = (*mapped)->Put(b);
  REQUIRE(pb.has_value());
  CHECK((*sealed)->Get(*pb, b.size()).value() == b);

  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  CHECK(PayloadArea::MapSealed(fds[0]).status().code() ==
        absl::StatusCode::kInvalidArgument);
  ::close(fds[0]);
  ::close(fds[1]);
}

}  // namespace
}  // namespace agentix::ipc
