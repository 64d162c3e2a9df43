// DirectConns: the worker's handed-over Calls connections and their
// sessions (docs/DIRECT-CALLS.md, stage 3). One DirectSession per client id
// (the registry), one FrameConnection per handed-over socket with the
// session as its consumer; the driver's records of direct calls (call,
// arg_chunk, cancel, stream_ack) are queued here for the frame intake, and
// the driver's replies to them are routed back to their session.
//
// No thread of its own. poll_fd() is an epoll descriptor holding the worker
// link, every direct socket (with the events its FrameConnection wants), a
// wake eventfd (FrameConnectionOptions::wake) and a deadline timerfd: the
// intake polls it where it polled the link (the leader/follower baton, the
// event loop's selector), so a direct frame wakes the same thread a link
// frame does and no thread hop is added. Drive() then does the direct
// sockets' I/O and deadlines, and the upload watchdog (ExpireUploads) runs
// there too, the timerfd waking it while an upload is watched.
//
// Thread-safety: every method may be called from any thread, but the poll
// side (Accept, Drive, Take*, FinishAll) from one at a time (the worker holds
// the GIL for them); Owns / Reply may run concurrently with it.
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"
#include "worker/direct/chunk_buffers.h"
#include "worker/direct/direct_session.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/ledger.h"
#include "worker/ipc/payload_area.h"

namespace agentix::sandbox {
struct FrameConnectionOptions;
}  // namespace agentix::sandbox

namespace agentix::worker {

class DirectConns {
 public:
  // `link_fd` (polled, never read or closed here) joins the poll set.
  // `area` (may be null; must outlive this): the payload area whose
  // counters and ledger (when the daemon made one) every session writes
  // (DirectRecords; the slot of a client comes with its direct_conn).
  static absl::StatusOr<std::unique_ptr<DirectConns>> Create(
      int link_fd, ipc::PayloadArea* area = nullptr);
  ~DirectConns();
  DirectConns(const DirectConns&) = delete;
  DirectConns& operator=(const DirectConns&) = delete;

  // Direct Namespace streams (docs/DIRECT-CALLS.md stage 8): a sandbox
  // event of a name whose stream was handed over is written on it (any
  // thread); true when that is all, false when the link must carry it too
  // (no such stream, or a relayed stream is open on the name:
  // OnNamespaceRelayed).
  bool SendNamespaceEvent(const ipc::Frame& frame);
  // The daemon's ns_relayed{name} (poll side).
  void OnNamespaceRelayed(const std::string& name);
  // The link's agentix:host_connected of `name` became the driver's record
  // (poll side): a stream of that name handed over since is answered
  // `opened` now. The host starts after it, so nothing it causes reaches
  // the sandbox before the sandbox has heard of it (it would send its
  // pending requests twice), as on a relayed stream, whose host_connected
  // precedes the host's next frames on the link.
  void OnHostConnected(const std::string& name);

  // Readable when the link or a direct socket has something to do.
  int poll_fd() const { return epoll_fd_.get(); }

  // Serves a kDirectConn frame's connection: `fds` holds the socket and,
  // with `frame.direct_conn.ring`, the ring's memfd (both taken). The
  // connection joins its client's session (made on first use) and its
  // pre-read bytes are handled now. An error (the ring refused: STATUS 3 is
  // written; no memory for the poll set) is reported as the connection's end
  // through TakeClosed.
  void Accept(const ipc::Frame& frame, std::vector<base::UniqueFd> fds);

  // Reads and writes what the direct sockets are ready for, runs due
  // deadlines and the upload watchdog; never blocks.
  void Drive();

  // The poll side's look at the poll set before a read (no wait): whether
  // the link is readable, so the intake reads it only then — on a direct
  // call the link has nothing, and a read that finds nothing is a system
  // call (~1 µs on this project's VMs). What the look saw is kept for the
  // next Drive(), which then makes no look of its own (same count of
  // system calls as before when the link is readable). True, keeping
  // nothing, while no direct connection is served.
  bool LookReady();

  // The intake holder's wait for the poll set (the intake baton's
  // ChannelWait; no GIL needed): epoll_wait for up to `timeout_ms` (-1:
  // until something is ready). What it saw is kept for the next LookReady,
  // which then makes no look of its own, so the holder's wake-up and the
  // look are one system call. > 0 ready, 0 nothing, < 0 failed (errno).
  // One waiter at a time, and the look it keeps is used by the poll side
  // after it returns (the baton orders the two; the set is level-triggered,
  // so a look that is old by then only costs another turn).
  int WaitReady(int timeout_ms);
  // Makes a WaitReady return: the one waiting now, or else the next at once
  // (the wake eventfd, until a Drive drains it). Any thread.
  void WakeWaiter();

  // For tests: the looks at the poll set LookReady and Drive made
  // themselves (an epoll_wait each), not counting WaitReady's.
  int64_t own_looks() const { return own_looks_.load(std::memory_order_relaxed); }

  // Where a chunked direct call's argument pieces are copied as they are
  // read (DriverSink::Land), so each byte is copied once: true if `bytes`
  // went there (frame.landed set). Without one (the default) they are
  // copied into the driver frames' data. Set it before the first Accept;
  // it runs on the poll side, under a session's lock.
  using ArgumentHome =
      std::function<bool(ipc::Frame& frame, std::string_view bytes)>;
  void LandArgumentsIn(ArgumentHome home);

  // The driver records the sessions produced since the last call, in order
  // (what the daemon would have written on the link for these calls).
  // `untagged`: the channel's count of records sent without a call id so
  // far (Writer::untagged_records), the mark of each call started here.
  // Valid until the next call (its vector is reused, capacity kept); the
  // caller may move a frame's bytes out (AddDirectRecords gives argument
  // buffers back to chunk_buffers()).
  std::vector<ipc::Frame>& TakeDriverFrames(uint64_t untagged);

  // Connections that ended since the last call: {conn, why} for the
  // daemon's direct_closed.
  std::vector<std::pair<uint64_t, std::string>> TakeClosed();

  // Whether a direct session runs `call_id` (its replies go to Reply; a
  // relayed call frame of that id is refused with CallIdInUse).
  bool Owns(const std::string& call_id);

  // The driver's output frames (result, result_chunk, stream_item, error) of
  // one direct call, given to its session (written at FlushReplies). False
  // if no session runs it. The side-channel barrier (docs/DIRECT-CALLS.md,
  // stage 5): a result, error or stream item of a call that emitted records
  // since its start or its last barrier (tagged ones, TagRecord, or
  // untagged ones: `untagged` grew past the call's mark) is held, and a
  // barrier_ask is appended to `link_out`, which the channel writes after
  // the records it queued; the call's later frames wait behind it. A call
  // that logged nothing asks nothing.
  bool Reply(std::vector<ipc::Frame> frames, uint64_t untagged,
             std::string& link_out);

  // The daemon's `barrier` answer: the held frames get its seqs and go to
  // their session; frames held behind them are released too, or asked for
  // again if the call emitted records since the ask.
  void OnBarrier(const ipc::Frame& answer, uint64_t untagged,
                 std::string& link_out);

  // A log record or trace event of `call_id` is about to be queued for the
  // daemon: the connection number to tag it with (`conn`), or 0 when no
  // direct session started that call. Marks the call as having emitted
  // records. Any thread.
  uint64_t TagRecord(std::string_view call_id);

  // barrier_ask frames sent (tests: the noop asks nothing).
  uint64_t barrier_asks();

  // Where the channel takes the buffers of a direct result's whole chunks
  // (result_chunk frames); the sessions give them back when the host has
  // acked them (chunk_buffers.h). Any thread.
  ChunkBuffers& chunk_buffers() { return *chunk_buffers_; }

  // Writes the events the sessions produced since the last call, one
  // batch per connection (the channel's flush() calls it; Drive too).
  void FlushReplies();

  // Shutdown: every connection gets `code` / `message` as its STATUS after
  // what is queued; waits (up to the connections' finish grace) until they
  // are written or given up, then closes them. Call without the GIL.
  void FinishAll(absl::StatusCode code, const std::string& message);

  // The daemon's changed calls-CPU answer (calls_cpu_answer: "wait" or
  // "off"): written, as the daemon writes it on a relayed connection, on
  // each connection that follows changes (direct_conn's follow 2) and on
  // one still owed its first answer (follow 1). Remembered for connections
  // handed over later, whose HELLO answer it may postdate. Poll side.
  void TellCallsCpu(const std::string& value);

  // The session of `client`, or null.
  std::shared_ptr<DirectSession> SessionOf(const std::string& client);

  // The daemon's `collapse{client}` (docs/DIRECT-CALLS.md, stage 4): the
  // client's open connections end with STATUS 14 (the host reconnects and
  // resumes), its session is exported and dropped from the registry. The
  // session_state frames for the link, the last marked; one empty one for
  // a client without a session.
  std::vector<ipc::Frame> Collapse(const std::string& client);

  // Open direct connections; sessions held.
  size_t connections();
  size_t sessions();

 private:
  class Conn;
  class Driver;

  DirectConns(base::UniqueFd epoll_fd, base::UniqueFd wake_fd,
              base::UniqueFd timer_fd, int link_fd, ipc::PayloadArea* area,
              std::unique_ptr<ipc::LedgerWriter> ledger);
  void Watch(int fd, uint32_t events, int op);
  void AcceptNamespace(const ipc::Frame& frame, std::vector<base::UniqueFd> fds);
  // Opens `conn`'s transport on the handed-over socket (and ring, if sent)
  // with the bytes read past its HELLO, keeps and watches it, and for a
  // Namespace stream makes it its name's; false (the refusal queued for the
  // daemon) if the transport cannot be made. The caller starts it.
  bool Open(const std::shared_ptr<Conn>& conn, const ipc::Frame& frame,
            std::vector<base::UniqueFd> fds,
            sandbox::FrameConnectionOptions options);
  void Reap(const std::shared_ptr<Conn>& conn);
  void ArmTimer(absl::Time at);
  void FinishHalfClosed(DirectSession* session);
  // Gives one call's output to its session; false if none runs it.
  bool Deliver(std::vector<ipc::Frame>& frames);
  // What a direct call emitted on the side channels, for its barrier.
  struct CallRecords {
    uint64_t conn = 0;           // the tag of its records (resolved once)
    bool tagged = false;         // records with its id since the last ask
    uint64_t untagged_mark = 0;  // Writer::untagged_records then
    bool asking = false;         // a barrier_ask is unanswered
    std::vector<std::vector<ipc::Frame>> held;  // output behind the ask
  };
  // Whether `frames` need the barrier now; if so the ask is appended.
  bool AskIfLogged(const std::string& call_id, CallRecords& call,
                   const std::vector<ipc::Frame>& frames, uint64_t untagged,
                   std::string& link_out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(side_mu_);

  const base::UniqueFd epoll_fd_;
  const base::UniqueFd wake_fd_;
  const base::UniqueFd timer_fd_;
  const int link_fd_;
  ipc::PayloadArea* const area_;
  const std::unique_ptr<ipc::LedgerWriter> ledger_;  // null: none
  std::unique_ptr<Driver> driver_;
  // Shared with every session, for results and one-piece arguments: 48
  // buffers (48 MiB) keep their pages (a 48 MiB echo's result reuses them
  // without a fault; 64 broke h-mem's bound on a worker's growth, stop 42);
  // up to 256 in all stay allocated, the others with their pages released,
  // so larger calls in flight leave no freed buffers in threads' arenas.
  const std::shared_ptr<ChunkBuffers> chunk_buffers_ =
      ChunkBuffers::Create(/*max_kept=*/256, /*max_faulted=*/48);

  std::vector<ipc::Frame> taken_;  // TakeDriverFrames' (poll side only)
  // LookReady's events, kept for the next Drive (poll side only; -1: none
  // kept). The poll set is level-triggered, so an fd that became ready
  // after the look is seen at the next poll.
  static constexpr int kMaxEvents = 64;
  epoll_event looked_[kMaxEvents];
  int looked_count_ = -1;
  // WaitReady's events, for the next LookReady (-1: none kept). Written by
  // the waiter, taken by the poll side: the count publishes the events.
  epoll_event waited_[kMaxEvents];
  std::atomic<int> waited_count_{-1};
  std::atomic<int64_t> own_looks_{0};
  // Drive's snapshots of the connections and sessions (poll side only).
  std::vector<std::shared_ptr<Conn>> drive_conns_;
  std::vector<std::shared_ptr<DirectSession>> drive_sessions_;

  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<DirectSession>> sessions_
      ABSL_GUARDED_BY(mu_);
  std::map<int, std::shared_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);  // by fd
  // Handed-over Namespace streams by name, and the names a relayed stream
  // was opened on meanwhile (their events go on the link too).
  absl::flat_hash_map<std::string, std::shared_ptr<Conn>> namespaces_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> relayed_names_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint64_t, std::string>> closed_ ABSL_GUARDED_BY(mu_);
  absl::Time timer_at_ = absl::InfiniteFuture();  // poll side only
  std::string calls_cpu_answer_;  // the latest told (poll side only)
  // The latest connection handed over for each client: a direct call's
  // records are tagged with it (the daemon maps it to the client).
  std::map<std::string, uint64_t> latest_conn_ ABSL_GUARDED_BY(mu_);

  absl::Mutex side_mu_;  // taken without mu_
  absl::flat_hash_map<std::string, CallRecords> records_
      ABSL_GUARDED_BY(side_mu_);
  uint64_t barrier_asks_ ABSL_GUARDED_BY(side_mu_) = 0;
};

}  // namespace agentix::worker
