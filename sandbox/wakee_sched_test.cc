#include "sandbox/wakee_sched.h"

#include <pthread.h>
#include <sched.h>

#include <thread>

#include <catch2/catch.hpp>

namespace agentix::sandbox {
namespace {

// The policy a fresh thread has after ApplyWakeeSched().
int PolicyAfterApply() {
  int policy = -1;
  std::thread([&] {
    ApplyWakeeSched();
    sched_param param = {};
    if (pthread_getschedparam(pthread_self(), &policy, &param) != 0) {
      policy = -1;
    }
  }).join();
  return policy;
}

TEST_CASE("A call-path thread runs SCHED_BATCH by default, SCHED_OTHER when "
          "turned off", "[wakee_sched]") {
  REQUIRE(WakeeBatchSched());  // the default (--calls_sched_batch)
  CHECK(PolicyAfterApply() == SCHED_BATCH);
  SetWakeeBatchSched(false);
  CHECK(PolicyAfterApply() == SCHED_OTHER);
  SetWakeeBatchSched(true);
  CHECK(PolicyAfterApply() == SCHED_BATCH);
}

TEST_CASE("A thread under another policy than SCHED_OTHER keeps it",
          "[wakee_sched]") {
  // SCHED_IDLE needs no privilege; a real-time policy would be kept alike.
  int policy = -1;
  int set_rc = -1;
  std::thread([&] {
    sched_param param = {};
    set_rc = pthread_setschedparam(pthread_self(), SCHED_IDLE, &param);
    ApplyWakeeSched();
    if (pthread_getschedparam(pthread_self(), &policy, &param) != 0) {
      policy = -1;
    }
  }).join();
  REQUIRE(set_rc == 0);
  CHECK(policy == SCHED_IDLE);
}

}  // namespace
}  // namespace agentix::sandbox
