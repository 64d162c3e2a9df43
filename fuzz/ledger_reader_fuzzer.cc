// libFuzzer target for the daemon's reading of a dead worker's ledger
// (worker/ipc/ledger.h: ReadLedger). The worker could have written anything
// into the region; the reader must only return entries of known clients
// with ids inside the bounds, and count the rest.
//
// Input: the first two bytes pick the slot counts (small, so the fuzzer's
// bytes reach the slots), the rest is the region as the worker left it.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "worker/ipc/ledger.h"

namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "ledger_reader_fuzzer: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace agentix::ipc;
  if (size < 2) return 0;
  const uint32_t calls = data[0] % 17;
  const uint32_t finished = data[1] % 17;
  data += 2;
  size -= 2;
  LedgerClients clients;
  (void)clients.SlotOf("");
  (void)clients.SlotOf("client-b");
  (void)clients.SlotOf("client-c");
  // The region as mapped: the fuzzer's bytes, then zeros (a fresh page).
  std::vector<char> region(std::max(size, LedgerBytes(calls, finished)));
  std::memcpy(region.data(), data, size);
  const bool fits = region.size() >= LedgerBytes(calls, finished);
  auto read = ReadLedger(absl::MakeConstSpan(region), calls, finished, clients);
  if (read.ok() != fits) Fail("accepted or refused the wrong region size");
  // The same bytes shorter than the counts need: refused, never read.
  if (LedgerBytes(calls, finished) > 0 &&
      ReadLedger(absl::MakeConstSpan(region.data(),
                                     LedgerBytes(calls, finished) - 1),
                 calls, finished, clients)
          .ok()) {
    Fail("read a region shorter than its slots");
  }
  if (!read.ok()) return 0;
  if (read->calls.size() + read->skipped > size_t{calls} + finished ||
      read->finished.size() > finished) {
    Fail("more entries than slots");
  }
  for (const LedgerCall& call : read->calls) {
    if (call.id.empty() || call.id.size() > kLedgerMaxIdBytes) {
      Fail("call id out of bounds");
    }
    if (call.client != "" && call.client != "client-b" &&
        call.client != "client-c") {
      Fail("unknown client");
    }
  }
  for (const LedgerFinished& done : read->finished) {
    if (done.id.empty() || done.id.size() > kLedgerFinishedIdBytes) {
      Fail("finished id out of bounds");
    }
  }
  // A writer opened on the same bytes must not write past the region.
  auto writer = LedgerWriter::Open(absl::MakeSpan(region));
  if (writer.ok()) {
    auto slot = (*writer)->Started(1, "fuzz-id");
    if (slot.has_value()) {
      (*writer)->Retained(*slot);
      (*writer)->Finished(*slot);
    }
  }
  return 0;
}
