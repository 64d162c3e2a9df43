#include "worker/channel/log_sender.h"

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>

#include <chrono>
#include <exception>
#include <thread>

#include "worker/ipc/io.h"

namespace agentix::worker {
namespace {

// Once woken, the log sender waits this long before taking the queue unless
// kLingerBytes are already there: a burst of records then goes out in one
// write, and its producers wake the sender once per batch instead of once per
// record (each wake cost the producer more than encoding its record). Calls'
// results and namespace events do not wait for it: they take the queue
// themselves (TakeLogs).
constexpr auto kLinger = std::chrono::microseconds(200);

// With `mu` held, after queueing: whether the caller must wake the sender
// (notify logs_cv once `mu` is released, so the sender does not wake up
// only to block on it). True at most once per sleep of the sender.
bool TakeSenderWake(Writer& w) {
  if (!w.sender_asleep) return false;
  w.sender_asleep = false;
  return true;
}

// The sender thread. Never touches Python.
void SendLogs(std::shared_ptr<Writer> writer) {
  pthread_setname_np(pthread_self(), "agx-log-sender");
  Writer& w = *writer;
  std::string batch;
  std::unique_lock<std::mutex> lock(w.mu);
  while (true) {
    while (w.logs.empty() && !w.sender_stop) {
      w.sender_asleep = true;
      w.logs_cv.wait(lock);
      w.sender_asleep = false;  // also when woken spuriously or by StopSender
    }
    if (w.logs.empty()) break;  // stopping, and everything is written
    if (w.logs.size() < kLingerBytes && !w.sender_stop) {
      // Not asleep meanwhile: producers just queue.
      lock.unlock();
      std::this_thread::sleep_for(kLinger);
      lock.lock();
      if (w.logs.empty()) continue;  // taken by a call's result meanwhile
    }
    w.idle_cv.wait(lock, [&w] { return !w.busy; });
    w.busy = true;
    batch.swap(w.logs);  // whatever is queued now, in order
    w.space_cv.notify_all();
    lock.unlock();
    const absl::Status status = ipc::WriteAll(w.fd, batch);
    batch.clear();
    lock.lock();
    w.busy = false;
    w.idle_cv.notify_all();
    if (!status.ok()) {
      // The daemon is gone; the driver finds out from its own writes.
      w.failed = true;
      w.logs.clear();
      w.space_cv.notify_all();
      break;
    }
  }
  w.sender_running = false;
  w.space_cv.notify_all();
}

}  // namespace

bool QueueLogs(Writer& w, std::string& frames) {
  std::unique_lock<std::mutex> lock(w.mu);
  w.space_cv.wait(lock, [&w] {
    return w.logs.size() < kMaxQueuedLogBytes || w.failed ||
           !w.sender_running;
  });
  if (w.failed || !w.sender_running) return false;
  if (w.logs.empty()) {
    w.logs.swap(frames);
  } else {
    w.logs.append(frames);
  }
  const bool wake = TakeSenderWake(w);
  lock.unlock();
  if (wake) w.logs_cv.notify_one();
  return true;
}

bool QueueLogsFromPython(const std::shared_ptr<Writer>& writer,
                         std::string& frames) {
  if (InForkedChild()) return false;
  Writer& w = *writer;
  {
    std::unique_lock<std::mutex> lock(w.mu);
    EnsureSenderLocked(writer);
    if (w.failed || !w.sender_running) return false;  // dropped
    if (w.logs.size() < kMaxQueuedLogBytes) {
      w.logs.append(frames);
      const bool wake = TakeSenderWake(w);
      lock.unlock();
      if (wake) w.logs_cv.notify_one();
      return true;
    }
  }
  bool queued = false;
  Py_BEGIN_ALLOW_THREADS
  queued = QueueLogs(w, frames);
  Py_END_ALLOW_THREADS
  return queued;
}

void EnsureSenderLocked(const std::shared_ptr<Writer>& writer) {
  Writer& w = *writer;
  if (w.sender_running || w.sender_stop || w.failed) return;
  try {
    w.sender = std::thread(SendLogs, writer);
    w.sender_running = true;
  } catch (const std::exception&) {
    // No thread: logging degrades to dropping records, calls are unaffected.
    w.failed = true;
  }
}

void StopSender(const std::shared_ptr<Writer>& writer, int timeout_ms) {
  Writer& w = *writer;
  std::unique_lock<std::mutex> lock(w.mu);
  if (!w.sender.joinable()) return;
  w.sender_stop = true;
  w.logs_cv.notify_all();
  const bool done = w.space_cv.wait_for(
      lock, std::chrono::milliseconds(timeout_ms),
      [&w] { return !w.sender_running; });
  std::thread sender = std::move(w.sender);
  lock.unlock();
  if (done) {
    sender.join();
  } else {
    sender.detach();
  }
}

}  // namespace agentix::worker
