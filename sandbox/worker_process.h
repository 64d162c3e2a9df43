// The daemon's handle on one `agentix-worker` process: spawns it with a
// private socketpair on fd 3, writes frames from a writer thread, reads
// frames on a reader thread and reports them (and the process's end) through
// WorkerProcess::Listener. One instance = one worker generation; a dead
// worker is replaced by a new instance, never restarted.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/child_process.h"
#include "base/unique_fd.h"
#include "sandbox/adopted_worker.h"
#include "sandbox/calls_cpu.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/ledger.h"
#include "worker/ipc/payload_area.h"

namespace agentix::sandbox {

// Told about the Calls connections a worker was handed (direct calls,
// docs/DIRECT-CALLS.md): on the worker's reader thread, never under a lock
// of the WorkerProcess. Implemented by sandbox/direct_connections.
class DirectLinkListener {
 public:
  virtual ~DirectLinkListener() = default;
  // The worker of `generation` reported `direct_closed` for `conn`.
  virtual void OnDirectClosed(uint64_t generation, uint64_t conn,
                              std::string_view why) = 0;
  // The worker of `generation` exited: every connection it held is closed.
  virtual void OnDirectWorkerGone(uint64_t generation) = 0;
};

struct WorkerOptions {
  std::string worker_path;   // the agentix-worker binary
  std::string venv;          // --venv, may be empty
  std::string python_path;   // --python-path, may be empty
  std::vector<std::string> extra_args;
  // Environment for the worker ("K=V"); AGENTIX_WORKER_ID is added.
  std::vector<std::string> env;
  // How long the worker may take to send `ready`.
  absl::Duration ready_timeout = absl::Seconds(15);
  // Bytes per payload ring shared with the worker (worker/ipc/payload_area.h);
  // 0: every payload goes through the socketpair.
  size_t payload_ring_bytes = ipc::kDefaultRingBytes;
  // After handing over frames, the reader thread polls the channel without
  // sleeping for up to this long before it blocks (adaptive, as
  // CompletionQueueThread's spin: a long wait halves the next window, a
  // short one restores it). 0: it blocks at once.
  absl::Duration read_spin = absl::ZeroDuration();
  // Set (--calls_cpu): the reader and writer threads follow its placement,
  // the reader reports each read's call ends to it and publishes its CPU to
  // the worker through the payload area, whose waiting threads pin
  // themselves to it (sandbox/calls_cpu.h; no payload area: the worker's
  // threads are never pinned). Null: the scheduler places them.
  std::shared_ptr<CallsCpu> calls_cpu;
  // Set (--direct_calls): told about the connections handed to the worker;
  // null: a `direct_closed` frame is a protocol error, as before.
  std::shared_ptr<DirectLinkListener> direct_listener;
  // Set (--direct_calls): the payload area gets a ledger of this many call
  // slots (LedgerCallSlots; worker/ipc/ledger.h) and kLedgerFinishedSlots
  // finished ids, formatted before the worker starts. 0: no ledger, and the
  // area is exactly the relayed path's.
  uint32_t ledger_call_slots = 0;
};

// The ledger's finished ring: as many ids as a session's FinishedIds keeps.
inline constexpr uint32_t kLedgerFinishedSlots = 65536;
// Call slots for a daemon keeping `max_retained_results` results per
// client: max(4096, it), within the ledger's bound.
uint32_t LedgerCallSlots(size_t max_retained_results);

// The payload area Start gives a worker of `options`, its ledger formatted
// when options.ledger_call_slots is set; agentix-launch makes its worker's
// the same way (Adopt checks the rings' size and the ledger's counts).
// kResourceExhausted if the memfd cannot be made.
absl::StatusOr<std::unique_ptr<ipc::PayloadArea>> CreateWorkerArea(
    const WorkerOptions& options);

// The worker's command line and environment as Start spawns it with id
// `worker_id` (fds: 0 /dev/null, 2 a stderr pipe, ipc::kWorkerChannelFd the
// channel, ipc::kWorkerPayloadFd the payload area when `payload_fd`). A
// launcher that starts a worker for the daemon to adopt must use exactly
// these (Adopt checks).
struct WorkerCommand {
  std::vector<std::string> argv;  // argv[0] is options.worker_path
  std::vector<std::string> env;
};
WorkerCommand BuildWorkerCommand(const WorkerOptions& options,
                                 const std::string& worker_id, bool payload_fd);

// A fresh worker id (8 hex digits), as Start gives each worker.
std::string NewWorkerId();

// A worker just spawned and the spawner's ends of its fds.
struct SpawnedWorker {
  base::ChildProcess child;
  base::UniqueFd channel;      // the spawner's end of the socketpair
  base::UniqueFd stderr_read;  // the read end of the worker's stderr pipe
};
// Which thread forks (base::ChildProcess): the daemon's process-lifetime
// launcher thread, or the caller's (a launcher whose calling thread becomes
// the daemon's main thread).
enum class SpawnThread { kLauncher, kCaller };
// Spawns the worker exactly as Start does (BuildWorkerCommand's command
// line; fds: 0 /dev/null, 2 a pipe, ipc::kWorkerChannelFd the socketpair,
// ipc::kWorkerPayloadFd `payloads`' memfd when not null). The worker's ends
// are closed here once it runs; every fd returned is close-on-exec.
absl::StatusOr<SpawnedWorker> SpawnWorker(const WorkerOptions& options,
                                          const std::string& worker_id,
                                          const ipc::PayloadArea* payloads,
                                          SpawnThread thread);

// Why a worker ended, as the calls it was running will be told.
struct WorkerExit {
  // "WorkerDied" (it was running and exited or broke the protocol) or
  // "WorkerBootError" (it never became ready).
  std::string error_type;
  // The original's wording, e.g. "runtime worker exited: killed by signal 9
  // (SIGKILL)" or "runtime worker failed to boot: ...".
  std::string message;
  // Exit code, or minus the signal; absent when unknown.
  std::optional<int> returncode;
};

class WorkerProcess {
 public:
  // Callbacks arrive on the worker's reader thread, never under a lock the
  // WorkerProcess holds. OnWorkerExit is the last callback for a generation.
  class Listener {
   public:
    virtual ~Listener() = default;
    // Every frame decoded from one read of the channel, in order. The
    // listener may move from them; the reader empties (and reuses) `frames`.
    virtual void OnWorkerFrames(uint64_t generation,
                                std::vector<ipc::Frame>& frames) = 0;
    virtual void OnWorkerExit(uint64_t generation, const WorkerExit& exit) = 0;
  };

  // Spawns the worker and starts its threads. Frames may be sent at once;
  // they are delivered after the worker's `ready`. Errors: spawn failures
  // (kNotFound for a missing binary, kFailedPrecondition otherwise).
  static absl::StatusOr<std::unique_ptr<WorkerProcess>> Start(
      const WorkerOptions& options, uint64_t generation, Listener* listener);

  // Takes over a worker a launcher started (AdoptedWorker): from here on it
  // is this generation's worker exactly as if Start had spawned it with
  // `options`. Its fds become this object's (closed on error too, unless
  // the pid is not our child: then they are not taken), and its
  // RLIMIT_NOFILE is set to this process's (the daemon raises its own before
  // spawning; a spawned worker inherits it). On any error the worker is
  // killed and reaped. kInvalidArgument: bad adoption arguments (the pid is
  // not our child, an fd is not a socket / pipe / payload area).
  // kFailedPrecondition: a worker Start would not have started (its command
  // line, environment or payload ring size differs from `options`: the
  // message names the first difference), or one that already exited (its
  // status and the end of its stderr); the caller may spawn one instead.
  static absl::StatusOr<std::unique_ptr<WorkerProcess>> Adopt(
      const WorkerOptions& options, const AdoptedWorker& adopted,
      uint64_t generation, Listener* listener);

  // Kills the process if still running and joins both threads. Must not be
  // called from the listener callbacks of this instance.
  ~WorkerProcess();

  // Sends one frame: written at once with a non-blocking write when the
  // channel is idle, otherwise queued for the writer thread. Thread-safe,
  // never blocks on I/O. Frames sent after the worker died are dropped (the exit callback
  // has told or will tell every caller).
  void Send(const ipc::Frame& frame);
  // Sends frames already encoded with the ipc codec (several may be
  // concatenated), with as few syscalls as possible.
  void SendEncoded(std::string bytes);
  // Sends one encoded frame with `fds` on its first byte (SCM_RIGHTS: a
  // direct_conn), in order with the frames sent before and after it; never
  // blocks (the writer thread sends it). The descriptors are closed once
  // sent, or dropped with the frame if the worker is gone.
  void SendWithDescriptors(std::string frame, std::vector<base::UniqueFd> fds);
  // Asks the worker to finish (`shutdown` frame), waits up to `grace`, then
  // kills it. Blocks; call from a non-callback thread.
  void Shutdown(absl::Duration grace);
  // Sends SIGKILL (used when the protocol is broken).
  void Kill();

  // The payload area shared with this worker, or nullptr (off, or it could
  // not be made). Its producer side (Put) is the caller's: one thread at a
  // time, in the order the frames referencing the pieces are sent. The
  // reader thread resolves the worker's ring references itself.
  ipc::PayloadArea* payloads() const { return payloads_.get(); }

  // Publishes the call path's current CPU (--calls_cpu) to the worker
  // (PayloadArea::PublishWaitCpu) if it changed since the last publish.
  // The reader does after each read; a placement made for direct calls
  // (a handed-over host's CPU, the probe's answer) has no relayed read
  // behind it, so the session manager calls this then. It never chooses a
  // CPU for direct calls itself: a direct worker pinned while its host runs
  // anywhere lost (docs/DECISIONS.md "stop-40: direct calls follow the
  // placement …"). Thread-safe.
  void PublishPlacement();

  pid_t pid() const { return pid_; }
  // True once the worker has sent `ready` (its boot is over).
  bool booted() const { return booted_.load(std::memory_order_acquire); }
  // True once its `ready` said it serves handed-over Calls connections.
  bool direct_capable() const {
    return direct_capable_.load(std::memory_order_acquire);
  }
  uint64_t generation() const { return generation_; }
  const std::string& worker_id() const { return worker_id_; }

  // Direct calls' ledger (docs/DIRECT-CALLS.md, "The ledger"). The slot of
  // `client` in this worker's ledger, assigned at its first hand-over and
  // kept for this worker's life; kFailedPrecondition when the area has no
  // ledger (--direct_calls off, or an adopted worker's area), then the
  // connection stays relayed; kResourceExhausted past kLedgerMaxClients.
  absl::StatusOr<uint32_t> LedgerClientSlot(const std::string& client);
  // After the worker exited: the calls its ledger holds, read as untrusted
  // input (ipc::ReadLedger). Empty contents when no client was ever handed
  // over (nothing is scanned).
  absl::StatusOr<ipc::LedgerContents> ReadLedger();

 private:
  WorkerProcess(uint64_t generation, Listener* listener);
  WorkerProcess(const WorkerOptions& options, uint64_t generation,
                Listener* listener, std::string worker_id);
  // The rest of Start and Adopt: owns the child and the channel, starts the
  // reader, writer and stderr threads.
  void Run(base::ChildProcess child, base::UniqueFd channel,
           base::UniqueFd stderr_read);
  void ReaderLoop();
  // Waits (spinning up to `window` first) until the channel has something
  // to read; returns the next spin window (see WorkerOptions::read_spin).
  absl::Duration SpinUntilReadable(absl::Duration window);
  void WriterLoop();
  // Copies a frame's payload out of the worker's ring into frame.data and
  // hands the space back. kInvalidArgument for a bad reference.
  absl::Status TakeRingPayload(ipc::Frame& frame);

  const uint64_t generation_;
  Listener* const listener_;
  std::string worker_id_;
  absl::Duration ready_timeout_;
  absl::Duration read_spin_;
  std::shared_ptr<CallsCpu> calls_cpu_;
  absl::Mutex placement_mu_;
  // The CallsCpu state whose CPU the worker was last given.
  uint64_t published_placement_ ABSL_GUARDED_BY(placement_mu_) = ~uint64_t{0};
  base::UniqueFd channel_;
  std::unique_ptr<ipc::PayloadArea> payloads_;
  pid_t pid_ = -1;
  std::atomic<bool> booted_{false};
  std::atomic<bool> direct_capable_{false};
  std::shared_ptr<DirectLinkListener> direct_listener_;
  // The ledger's call slots as this daemon formatted them (0: no ledger),
  // and the clients given slots in it (the daemon's memory: the worker
  // could overwrite anything in the area).
  uint32_t ledger_call_slots_ = 0;
  absl::Mutex ledger_mu_;
  ipc::LedgerClients ledger_clients_ ABSL_GUARDED_BY(ledger_mu_);

  absl::Mutex child_mu_;
  base::ChildProcess child_ ABSL_GUARDED_BY(child_mu_);

  // The channel's write side has one owner at a time (`writing_`): either a
  // Send() caller writing inline without blocking (the common, low-latency
  // path) or the writer thread, which takes over whatever would block.
  absl::Mutex out_mu_;
  // Encoded frames; one that carries descriptors is alone in its entry.
  struct Outbound {
    std::string bytes;
    std::vector<base::UniqueFd> fds;
  };
  std::deque<Outbound> outbound_ ABSL_GUARDED_BY(out_mu_);
  bool writing_ ABSL_GUARDED_BY(out_mu_) = false;
  bool writer_stop_ ABSL_GUARDED_BY(out_mu_) = false;

  std::thread reader_;
  std::thread writer_;

  // The worker's own stderr (its diagnostics, faulthandler's crash report;
  // Python-level output is captured into log frames instead): copied to the
  // daemon's stderr as it comes, the last kStderrKeptBytes kept for the
  // WorkerDied message, which quotes the last kStderrTailBytes, or a crash
  // report whole from its "Fatal Python error" line (up to kStderrKeptBytes:
  // with every thread's stack it is often longer than the usual tail).
  void StderrLoop(base::UniqueFd pipe);
  std::string StderrTail();
  static constexpr size_t kStderrTailBytes = 2048;
  static constexpr size_t kStderrKeptBytes = 16384;
  absl::Mutex stderr_mu_;
  std::string stderr_tail_ ABSL_GUARDED_BY(stderr_mu_);
  bool stderr_eof_ ABSL_GUARDED_BY(stderr_mu_) = false;
  std::thread stderr_reader_;
};

}  // namespace agentix::sandbox
