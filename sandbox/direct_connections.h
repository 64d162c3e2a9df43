// The Calls connections the frame wire handed to the worker (direct calls,
// docs/DIRECT-CALLS.md): numbered, bounded, and counted as open streams
// (StreamActivity) and connections (the connection guard) until the worker
// reports `direct_closed` or exits. The daemon holds no descriptor of them.
#pragma once

#include <functional>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sandbox/stream_activity.h"
#include "sandbox/worker_process.h"

namespace agentix::sandbox {

class DirectConnections final : public DirectLinkListener {
 public:
  // `max_live`: hand-overs refused beyond this many live ones (the daemon:
  // min(--max-connections, 256)). `activity` may be null; must outlive this.
  DirectConnections(size_t max_live, StreamActivity* activity)
      : max_live_(max_live), activity_(activity) {}

  // A number for a connection of `client` about to be handed to the worker
  // of `generation`, counted from here on; nullopt when max_live are live.
  // `calls`: a Calls connection, whose client's sessions the orphan timer
  // watches (a Namespace stream's, stage 8, is not).
  std::optional<uint64_t> Reserve(uint64_t generation,
                                  std::string_view client = {},
                                  bool calls = true);
  // The connection's descriptor was handed over (HandOverConnection said
  // `guard_counted`) and the daemon's is closed: it is counted as open
  // until the worker reports it closed. `on_end` (may be empty) runs once
  // then, or when its worker exits (a Namespace stream's hub slot).
  void Commit(uint64_t conn, bool guard_counted,
              std::function<void()> on_end = nullptr);
  // A reserved connection was not handed over after all.
  void Cancel(uint64_t conn);

  // DirectLinkListener (the worker's reader thread).
  void OnDirectClosed(uint64_t generation, uint64_t conn,
                      std::string_view why) override;
  void OnDirectWorkerGone(uint64_t generation) override;

  // Connections reserved or handed over and not yet closed.
  size_t live();
  // direct_closed frames that named no live connection of their worker
  // (a confused or hostile worker; logged once each).
  uint64_t unknown_closes();

  // The orphan timer (--direct_orphan_s): clients whose last connection
  // closed at least `after` before `now` and none came back since; each is
  // returned once per orphaning.
  std::vector<std::string> TakeOrphans(absl::Time now, absl::Duration after);
  // Whether a connection of `client` is reserved or live.
  bool HasLive(std::string_view client);

 private:
  struct Entry {
    uint64_t generation = 0;
    bool committed = false;
    bool guard_counted = false;
    std::string client;
    bool calls = true;
    std::function<void()> on_end;
  };
  // A client's live connections, and since when it has none.
  struct Client {
    size_t live = 0;
    absl::Time orphaned_at = absl::InfiniteFuture();
  };
  void Drop(const Entry& entry);
  void Unlive(const Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_live_;
  StreamActivity* const activity_;
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> live_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t unknown_closes_ ABSL_GUARDED_BY(mu_) = 0;
  // Generations whose worker exited (one entry per worker started).
  absl::flat_hash_set<uint64_t> gone_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Client> clients_ ABSL_GUARDED_BY(mu_);
};

}  // namespace agentix::sandbox
