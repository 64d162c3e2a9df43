#include "worker/channel/writer.h"

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>

#include <atomic>

#include "worker/ipc/io.h"

namespace agentix::worker {
namespace {

std::atomic<bool> g_in_forked_child{false};

}  // namespace

void AcquireWrite(Writer& w) {
  {
    std::lock_guard<std::mutex> lock(w.mu);
    if (!w.busy) {
      w.busy = true;
      return;
    }
  }
  Py_BEGIN_ALLOW_THREADS
  {
    std::unique_lock<std::mutex> lock(w.mu);
    w.idle_cv.wait(lock, [&w] { return !w.busy; });
    w.busy = true;
  }
  Py_END_ALLOW_THREADS
}

void WaitIdle(Writer& w) {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(w.mu);
      if (!w.busy) return;
    }
    // A waiter must let go of the GIL: the writer may need it to finish.
    // Checked again once the GIL is back: another thread may have started
    // a write while this one waited for the GIL.
    Py_BEGIN_ALLOW_THREADS
    {
      std::unique_lock<std::mutex> lock(w.mu);
      w.idle_cv.wait(lock, [&w] { return !w.busy; });
    }
    Py_END_ALLOW_THREADS
  }
}

void Leave(Writer& w) {
  std::lock_guard<std::mutex> lock(w.mu);
  w.busy = false;
  w.idle_cv.notify_all();
}

std::string TakeLogs(Writer& w) {
  std::string logs;
  std::lock_guard<std::mutex> lock(w.mu);
  logs.swap(w.logs);
  w.space_cv.notify_all();
  return logs;
}

absl::Status WriteQueued(Writer& w, std::string& out) {
  std::string logs = TakeLogs(w);
  absl::Status status;
  if (!logs.empty()) status = ipc::WriteAll(w.fd, logs);
  if (status.ok()) status = ipc::WriteAll(w.fd, out);
  out.clear();
  return status;
}

bool InForkedChild() {
  return g_in_forked_child.load(std::memory_order_relaxed);
}

void WatchForks() {
  static std::once_flag atfork_once;
  std::call_once(atfork_once, [] {
    pthread_atfork(nullptr, nullptr, [] { g_in_forked_child.store(true); });
  });
}

}  // namespace agentix::worker
