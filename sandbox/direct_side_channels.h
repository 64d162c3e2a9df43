// The daemon's side of direct calls' log records and trace events
// (docs/DIRECT-CALLS.md, stage 5). The worker tags the `log` / `trace`
// frames of a direct call with the number of the handed-over connection
// (`conn`); the daemon still numbers every record, routes a tagged record to
// the client it saw in that connection's HELLO, and remembers the last seq
// it gave each direct call's records until the worker asks for them
// (`barrier_ask`, answered with `barrier`): the seqs the worker stamps on
// the call's result, error or stream item, as SessionManager::StampBarrier
// does for a relayed call.
//
// Thread-safe (one lock of its own, a leaf: taken under the session
// manager's lock and without it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "sandbox/seq_buffer.h"

namespace agentix::sandbox {

class DirectSideChannels {
 public:
  // Clients of this many connections are remembered (the live ones are at
  // most 256): records of a closed connection's call may arrive after its
  // `direct_closed`. Calls whose seqs wait for an ask: beyond
  // `max_calls` (a worker that never asks) they are all forgotten.
  static constexpr size_t kRememberedConns = 4096;
  static constexpr size_t kMaxCalls = 65536;

  explicit DirectSideChannels(size_t remembered_conns = kRememberedConns,
                              size_t max_calls = kMaxCalls)
      : remembered_conns_(remembered_conns), max_calls_(max_calls) {}

  // The frame wire handed connection `conn` of `client` to the worker of
  // `generation`.
  void NameClient(uint64_t generation, uint64_t conn, std::string client);
  // The client of `conn`; nullopt for a connection this worker was not
  // given (or one forgotten).
  std::optional<std::string> ClientOf(uint64_t generation, uint64_t conn);
  // The worker of `generation` exited: its connections and calls go.
  void ForgetWorker(uint64_t generation);

  // `owners`: the clients of a batch of records (runs, as OwnersOf gives
  // them for relayed calls); `calls`: the call ids the records name (runs);
  // `conns`: each record's tag (0: none), one per record. Records tagged
  // with a connection of this worker and naming a call go to that
  // connection's client; the others keep their owner. Records tagged with
  // an unknown connection are treated as a relayed record of a call the
  // daemon forgot is today: every stream gets them (counted: unknown_tags).
  std::vector<IdRun> Owners(uint64_t generation, const std::vector<IdRun>& calls,
                            const std::vector<uint64_t>& conns,
                            const std::vector<IdRun>& owners);
  // Notes the seqs (numbered from `first`) of the tagged records of a batch
  // described as for Owners: each named call's last log (or trace) seq.
  void TrackSeqs(uint64_t generation, const std::vector<IdRun>& calls,
                 const std::vector<uint64_t>& conns, uint64_t first,
                 bool trace);

  // The seqs noted for `call_id` (0 where none), forgotten by the answer.
  struct Seqs {
    uint64_t log_seq = 0;
    uint64_t trace_seq = 0;
  };
  Seqs Take(uint64_t generation, std::string_view call_id);

  uint64_t unknown_tags();
  size_t calls_waiting();

 private:
  struct Client {
    uint64_t generation = 0;
    std::string id;
  };
  struct CallSeqs {
    uint64_t generation = 0;
    Seqs seqs;
  };

  const size_t remembered_conns_;
  const size_t max_calls_;
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Client> clients_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> named_ ABSL_GUARDED_BY(mu_);  // oldest first
  absl::flat_hash_map<std::string, CallSeqs> calls_ ABSL_GUARDED_BY(mu_);
  uint64_t unknown_tags_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace agentix::sandbox
