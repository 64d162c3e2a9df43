#include "sandbox/server_stream.h"

#include <algorithm>

#include <grpcpp/alarm.h>
#include <pthread.h>

#include "base/log.h"

namespace agentix::sandbox {
namespace {

// Marks the moment the polling thread reaches it.
class Barrier final : public Completion {
 public:
  void Complete(bool /*ok*/) override {
    absl::MutexLock lock(&mu_);
    reached_ = true;
  }
  bool WaitUntil(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithDeadline(absl::Condition(&reached_), deadline);
  }

 private:
  absl::Mutex mu_;
  bool reached_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

CompletionQueueThread::CompletionQueueThread(grpc::ServerCompletionQueue* cq,
                                             const char* name,
                                             absl::Duration spin)
    : cq_(cq) {
  thread_ = std::thread([this, spin] {
    if (spin > absl::ZeroDuration()) {
      PollSpinning(spin);
      return;
    }
    void* tag = nullptr;
    bool ok = false;
    while (cq_->Next(&tag, &ok)) static_cast<Completion*>(tag)->Complete(ok);
  });
  pthread_setname_np(thread_.native_handle(), name);
}

void CompletionQueueThread::PollSpinning(absl::Duration spin) {
  const gpr_timespec now_only = gpr_time_0(GPR_CLOCK_MONOTONIC);
  absl::Duration window = spin;
  void* tag = nullptr;
  bool ok = false;
  while (true) {
    bool got = false;
    const absl::Time waiting_since = absl::Now();
    if (window >= absl::Microseconds(1)) {
      const absl::Time until = waiting_since + window;
      do {
        const auto status = cq_->AsyncNext(&tag, &ok, now_only);
        if (status == grpc::CompletionQueue::SHUTDOWN) return;
        got = status == grpc::CompletionQueue::GOT_EVENT;
      } while (!got && absl::Now() < until);
    }
    if (!got) {
      if (!cq_->Next(&tag, &ok)) return;
      // Adapt: spinning pays only when the next completion comes soon. The
      // whole wait counts (spin and sleep): one no longer than the longest
      // window doubles the window, a longer one halves it, so a stream that
      // alternates (a write's completion at once, the next read much later)
      // settles near the short wait instead of spinning before every read.
      window = absl::Now() - waiting_since <= spin
                   ? std::min(spin, std::max(window * 2, absl::Microseconds(1)))
                   : window / 2;
    }
    static_cast<Completion*>(tag)->Complete(ok);
  }
}

void CompletionQueueThread::AddLive() {
  absl::MutexLock lock(&mu_);
  ++live_;
}

void CompletionQueueThread::RemoveLive() {
  absl::MutexLock lock(&mu_);
  --live_;
}

bool CompletionQueueThread::DrainQueued(absl::Time deadline) {
  Barrier barrier;
  grpc::Alarm alarm;
  alarm.Set(cq_, gpr_now(GPR_CLOCK_MONOTONIC), &barrier);
  if (barrier.WaitUntil(deadline)) return true;
  alarm.Cancel();  // its completion still comes, before the alarm goes
  barrier.WaitUntil(absl::InfiniteFuture());
  return false;
}

void CompletionQueueThread::Stop(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  const absl::Time deadline = absl::Now() + grace;
  // A call whose arrival is still queued becomes live when it runs: wait
  // for the live ones, run what is queued, check again.
  while (true) {
    int live;
    {
      absl::MutexLock lock(&mu_);
      auto none_live = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return live_ == 0;
      };
      mu_.AwaitWithDeadline(absl::Condition(&none_live), deadline);
      live = live_;
    }
    if (live > 0) {
      AGX_LOG(Warning, "{} calls still running at shutdown", live);
      break;
    }
    if (!DrainQueued(deadline)) break;
    absl::MutexLock lock(&mu_);
    if (live_ == 0) break;
  }
  cq_->Shutdown();
  thread_.join();
}

}  // namespace agentix::sandbox
