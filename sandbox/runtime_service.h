// RuntimeService: the gRPC adapter over SessionManager. It converts
// stream messages to manager calls and manager events to stream writes; all
// decisions live in the manager.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "agentix/runtime/v1/runtime.grpc.pb.h"
#include "sandbox/flush_scheduler.h"
#include "sandbox/server_stream.h"
#include "sandbox/session_manager.h"

namespace agentix::sandbox {

// How long a Logs or Traces message may be held back to gather a burst's
// records, and how much it may gather before it goes anyway. A host pays a
// fixed 300-500 µs of Python per message however few records it carries, so
// in a burst of 20,000-40,000 records/s messages of ~100 records cost it
// half the CPU per record of ~25-record ones (1 ms) and a fraction of what
// back-to-back writes (3-13 records) cost (docs/PERFORMANCE.md). 4 ms is far
// below what a person reading logs or a trace processor notices, and a
// record after a quiet moment still goes at once.
inline constexpr std::chrono::milliseconds kSideChannelCoalesceDelay{4};
// While a burst goes on (each message was held back its full delay), the
// delay doubles up to this: at 16 ms messages carry ~4x the records and the
// host's fixed cost per message shrinks with it (docs/DECISIONS.md). The
// first record after a quiet moment goes at once and resets it to 4 ms; a
// call's barrier still writes at once.
inline constexpr std::chrono::milliseconds kSideChannelCoalesceMaxDelay{16};
inline constexpr size_t kSideChannelCoalesceBytes = 256 << 10;

// A Logs or Traces subscriber that reads slower than the sandbox writes is
// paused once this much waits for it (plus at most one delivery): it takes
// no new records, which stay in the shared buffer, until it has read all
// but a quarter of this; the buffer then sends it what it still holds after
// the subscriber's last record, and reports what it evicted meanwhile
// (SeqBuffer::Subscriber::Deliver). So a lagging host's stream is neither
// unbounded nor ended (before stop 27 it was ended with RESOURCE_EXHAUSTED,
// losing what it held: docs/RELIABILITY.md).
inline constexpr size_t kSideChannelMaxUnwrittenBytes = 8u << 20;
// A Logs or Traces message carries at most about this much (a thousand or
// more records): what each subscriber holds serialized while its write is
// in flight, however many subscribers there are.
inline constexpr size_t kSideChannelMaxBatchBytes = 256u << 10;

// Serves every RuntimeService method with the completion-queue API; the
// reactions run on the thread that polls the queue (server_stream.h).
class RuntimeServiceImpl final {
 public:
  // The streaming methods are raw: their streams parse each message
  // themselves, to answer an unparseable one (server_stream.h).
  using Service = runtime::v1::RuntimeService::WithRawMethod_Calls<
      runtime::v1::RuntimeService::WithRawMethod_Logs<
          runtime::v1::RuntimeService::WithRawMethod_Traces<
              runtime::v1::RuntimeService::WithRawMethod_Namespace<
                  runtime::v1::RuntimeService::WithAsyncMethod_GetInfo<
                      runtime::v1::RuntimeService::Service>>>>>;

  // `manager` must outlive the service; the service must outlive the
  // grpc::Server serving it and the thread polling its queue.
  // `activity` (may be null; must outlive the streams) counts the open
  // streams for SandboxAdmin.GetStatus.
  RuntimeServiceImpl(SessionManager* manager, std::string version,
                     StreamActivity* activity = nullptr);

  RuntimeServiceImpl(const RuntimeServiceImpl&) = delete;
  RuntimeServiceImpl& operator=(const RuntimeServiceImpl&) = delete;

  // Before BuildAndStart.
  void AddTo(grpc::ServerBuilder& builder) {
    builder.RegisterService(&service_);
  }
  // After BuildAndStart: takes calls on the queue `thread` polls (one of
  // the same server's).
  void Start(CompletionQueueThread* thread);

 private:
  SessionManager* const manager_;
  const std::string version_;
  StreamActivity* const activity_;
  Service service_;
  // Runs the Logs and Traces streams' delayed (coalesced) writes. Outlives
  // the streams: the queue's thread deletes the last ones as it stops.
  FlushScheduler flush_scheduler_;
};

}  // namespace agentix::sandbox
