// Test support: waits for the prefault thread to finish its work.
#pragma once

#include <chrono>
#include <thread>

#include "worker/python/prefault.h"

namespace agentix::worker {

// The prefault state once it reports finished, or as it stands after 30 s
// (the caller's checks then fail on what was not done).
inline PrefaultState WaitPrefaultFinished() {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  PrefaultState state = GetPrefaultState();
  while (!state.finished && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    state = GetPrefaultState();
  }
  return state;
}

}  // namespace agentix::worker
