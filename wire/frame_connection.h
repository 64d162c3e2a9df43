// One host's Calls connection on the frame wire (docs/FRAME-WIRE.md), served
// after its HELLO: the transport a worker needs to serve a connection the
// daemon handed over (docs/DIRECT-CALLS.md, stage 3), independent of who owns
// the calls. It reads the host's MESSAGE / RING_MESSAGE / HALF_CLOSE frames
// and hands each parsed CallsRequest to a consumer; it writes CallsResponse
// events as the daemon batches them, STATUS frames and calls-CPU HELLO
// answers, with the daemon's bounds (unwritten bytes, stalled host, read
// pause, STATUS grace). Frames the host may not send end the connection with
// the STATUS the daemon would write (3 INVALID_ARGUMENT, saying what).
//
// No thread of its own: an owner's poll loop drives it (fd(), PollEvents(),
// NextDeadline(), then ReadReady() / WriteReady() / OnDeadline()). Threads:
// that poll thread (the read side, and the consumer's callbacks) and a
// writer thread (Send, SendCallsCpuAnswer, Finish, AwaitRoom); the write
// side is safe from both (the poll thread writes BadRequest errors and
// refusals, and the consumer may reply from its callbacks).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "wire/frame_codec.h"
#include "wire/frame_read_buffer.h"
#include "wire/frame_splice.h"
#include "wire/sandbox_event.h"
#include "worker/ipc/payload_area.h"

namespace agentix::sandbox {

// What the connection reads, handed to its owner. Called on the poll thread
// only, never with the connection's write lock held: a consumer may Send or
// Finish from inside.
class FrameConnectionConsumer {
 public:
  virtual ~FrameConnectionConsumer() = default;
  // One CallsRequest of the host. `request.bulk` views (large arguments
  // left in the read buffer or in the host's ring) are valid until this
  // returns: copy what is kept.
  virtual void OnRequest(SplicedRequest& request) = 0;
  // One MESSAGE payload, unparsed, instead of OnRequest on a connection
  // made with FrameConnectionOptions::raw_messages (a Namespace stream's:
  // docs/DIRECT-CALLS.md stage 8). Valid until this returns.
  virtual void OnMessage(absl::string_view payload) {}
  // HALF_CLOSE: the host sends nothing more. The consumer ends the stream
  // (Finish(kOk)) once its calls are terminal and written.
  virtual void OnHalfClose() = 0;
  // Once, when the connection is done (Done()): `why` is the STATUS it
  // wrote (kOk included), or kUnavailable for an EOF or socket error with
  // none. Nothing is called after; the owner may then destroy the
  // connection, from inside OnEnd too (it is the last thing the connection
  // does in that call), once no writer thread uses it any more.
  virtual void OnEnd(absl::Status why) = 0;
};

struct FrameConnectionOptions {
  // A host frame longer than this is refused (STATUS 3); at most
  // kMaxFrameMessageBytes, which the codec refuses anyway.
  size_t max_message_bytes = kMaxFrameMessageBytes;
  // Unwritten bytes past which Send reports kOverBound (the daemon's
  // --max_retained_bytes for results) and the stalled-host timer runs.
  size_t max_unwritten_bytes = size_t{512} << 20;
  // Over the bound with nothing written for this long: STATUS 8, the
  // unwritten frames dropped (the daemon's --stalled_host_timeout_s).
  absl::Duration stalled_host_timeout = absl::Seconds(20);
  // Above this many unwritten bytes the host's frames are not read until a
  // quarter is left (the daemon's 64 MiB, as on gRPC).
  size_t pause_reads_above_bytes = size_t{64} << 20;
  // A STATUS the host does not read within this is given up (the socket is
  // done; closing it is an EOF without STATUS).
  absl::Duration finish_grace = absl::Seconds(2);
  // Called (from any of the two threads, maybe under the write lock: it
  // must only wake, e.g. write an eventfd) when PollEvents() or
  // NextDeadline() changed behind the poll thread's back.
  std::function<void()> wake;
  // MESSAGE payloads go to OnMessage unparsed, and RING_MESSAGE is refused
  // (a Namespace stream has no ring).
  bool raw_messages = false;
};

class FrameConnection {
 public:
  // Serves `fd` (a connected stream socket whose HELLO was read; owned from
  // here on, shut down at Done(), closed by the destructor; every read and
  // write is non-blocking, MSG_DONTWAIT). `pre`: the bytes
  // read past HELLO, handled by Start(). `ring_fd`: the host's payload ring
  // (its memfd, sealed; -1 for none), mapped with PayloadArea::MapSealed and
  // closed. A ring that cannot be mapped is answered STATUS 3 naming why
  // (as the daemon answers it at HELLO), and both fds are closed:
  // kInvalidArgument. `consumer` must outlive the connection.
  static absl::StatusOr<std::unique_ptr<FrameConnection>> Create(
      int fd, std::string pre, int ring_fd, FrameConnectionConsumer* consumer,
      FrameConnectionOptions options);
  ~FrameConnection();
  FrameConnection(const FrameConnection&) = delete;
  FrameConnection& operator=(const FrameConnection&) = delete;

  // ---- poll thread ----
  int fd() const { return fd_; }
  // Handles the frames in `pre`; once, before polling.
  void Start();
  // What to poll fd() for now: POLLIN unless reads pause, POLLOUT while
  // bytes wait. 0 once Done().
  short PollEvents();
  // When OnDeadline() has something to do (the stalled-host bound, the
  // STATUS grace, a large idle read buffer), or InfiniteFuture.
  absl::Time NextDeadline();
  // fd() is readable (or hung up): reads what is there and handles every
  // whole frame.
  void ReadReady();
  // fd() is writable: writes what is queued.
  void WriteReady();
  void OnDeadline();
  // Nothing more will be read or written; OnEnd has been called.
  bool Done() const { return end_reported_; }

  // ---- writer thread ----
  enum class Backlog {
    kNone,       // written whole
    kQueued,     // some bytes wait for WriteReady (within the bound)
    kOverBound,  // more than max_unwritten_bytes wait: see AwaitRoom
  };
  // Queues `events` as MESSAGE frames of CallsResponse messages of at most
  // kMaxBatchBytes (frame_splice.h AppendMessagePieces: large bulk bytes
  // through the host's ring when it has room, else written from the event
  // itself), written at once when nothing was queued. kFailedPrecondition
  // once the connection is ending (a STATUS queued) or broken;
  // kResourceExhausted when this call found the host stalled (over the
  // bound, nothing written for stalled_host_timeout: STATUS 8 is queued).
  absl::StatusOr<Backlog> Send(const std::vector<SandboxEventPtr>& events);
  // Queues each of `messages` (serialized, e.g. NamespaceResponse) as one
  // MESSAGE frame; as Send otherwise.
  absl::StatusOr<Backlog> SendMessages(const std::vector<std::string>& messages);
  // A calls-CPU HELLO answer (docs/FRAME-WIRE.md "Wake-ups"): a HELLO frame
  // holding agentix-calls-cpu `value` ("wait" or "off").
  absl::StatusOr<Backlog> SendCallsCpuAnswer(absl::string_view value);
  // Queues the STATUS frame after what is queued (or instead of it, but the
  // rest of a frame partly written, with `drop_queued`); nothing is sent
  // after it. Once; later calls do nothing.
  void Finish(absl::StatusCode code, absl::string_view message,
              bool drop_queued = false);
  // Blocks while more than max_unwritten_bytes wait, writing as the socket
  // takes them. OK once within the bound; kResourceExhausted when the host
  // read nothing for stalled_host_timeout (the connection then ends with
  // STATUS 8, dropping what was queued); kFailedPrecondition when it ends
  // otherwise meanwhile.
  absl::Status AwaitRoom();
  // Bytes queued and not yet written.
  size_t UnwrittenBytes();

 private:
  FrameConnection(int fd, std::string pre,
                  std::unique_ptr<ipc::PayloadArea> ring,
                  FrameConnectionConsumer* consumer,
                  FrameConnectionOptions options);

  // Read side (poll thread).
  bool ReadSome();  // false on EOF or a socket error
  void ProcessFrames();
  bool HandleFrame(const FrameView& frame);  // false once ending
  bool HandleRingMessage(absl::string_view payload);
  bool Refuse(absl::string_view why);  // STATUS 3; false
  // Reads pause above pause_reads_above_bytes unwritten and go on below a
  // quarter of it; frames buffered meanwhile are then handled (OnDeadline).
  void UpdatePause(size_t unwritten);
  void ReportEndIfDone();

  // Write side (under mu_).
  absl::StatusOr<Backlog> QueueLocked(std::deque<OutPiece> pieces)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked(absl::StatusCode code, absl::string_view message,
                    bool drop_queued) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Over the bound with no progress for the stalled timeout: STATUS 8.
  bool CheckStalledLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Backlog BacklogLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool DoneLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Wake();

  const int fd_;
  FrameConnectionConsumer* const consumer_;
  const FrameConnectionOptions options_;
  // The host's payload ring: the reader takes its pieces (Get, Release),
  // the writer puts results into the other half (Put, under mu_).
  const std::unique_ptr<ipc::PayloadArea> ring_;

  // Read side: the poll thread only.
  FrameReadBuffer read_;
  absl::Time shrink_read_buffer_at_ = absl::InfiniteFuture();
  bool half_closed_ = false;
  bool eof_ = false;       // EOF or a read error: the host is gone
  bool paused_ = false;    // reads pause for a write backlog
  bool resume_frames_ = false;  // unpaused with whole frames buffered
  bool stray_fds_ = false;  // a descriptor came: refused
  bool end_reported_ = false;
  // ending_ or broken_, for the reader to stop handling frames without the
  // lock once the consumer (or a refusal) finished the stream.
  std::atomic<bool> closing_{false};
  SplicedRequest request_;
  std::vector<RingPiece> ring_pieces_;

  // Write side. ring_mu_ (taken before mu_) orders the senders that put
  // bulk bytes into the host's ring (PayloadArea::Put: one at a time).
  absl::Mutex ring_mu_;
  absl::Mutex mu_;
  OutQueue queue_ ABSL_GUARDED_BY(mu_);  // whole frames
  bool ending_ ABSL_GUARDED_BY(mu_) = false;  // a STATUS is queued
  bool broken_ ABSL_GUARDED_BY(mu_) = false;  // a write failed
  bool done_ ABSL_GUARDED_BY(mu_) = false;    // OnEnd is called
  absl::Status status_ ABSL_GUARDED_BY(mu_);  // the STATUS queued
  absl::Time end_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // Since when the queue is over the bound with nothing written.
  absl::Time stalled_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
};

}  // namespace agentix::sandbox
