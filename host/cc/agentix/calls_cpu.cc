#include "agentix/calls_cpu.h"

#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace agentix::client_internal {
namespace {

absl::Status Invalid(absl::string_view value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("AGENTIX_CALLS_CPU=", value, " ", why));
}

}  // namespace

absl::StatusOr<int> ParseCallsCpu(absl::string_view value) {
  const std::string setting = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  if (setting.empty() || setting == "off") return -1;
  absl::string_view cpu_text = setting;
  const bool wait = absl::ConsumePrefix(&cpu_text, "wait");
  if (wait && cpu_text.empty()) {
    const int cpu = ::sched_getcpu();
    if (cpu < 0) return Invalid(value, "needs sched_getcpu, which failed here");
    return cpu;
  }
  if (wait && !absl::ConsumePrefix(&cpu_text, ":")) {
    return Invalid(value, "is not off, wait[:CPU], auto or a CPU number");
  }
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    return Invalid(value, "needs this thread's CPU mask, which cannot be read");
  }
  int cpu = -1;
  if (cpu_text == "auto") {
    for (int i = CPU_SETSIZE - 1; i >= 0 && cpu < 0; --i) {
      if (CPU_ISSET(i, &allowed)) cpu = i;
    }
  } else if (cpu_text.empty() || !absl::ascii_isdigit(cpu_text[0]) ||
             !absl::SimpleAtoi(cpu_text, &cpu)) {
    return Invalid(value, "is not off, wait[:CPU], auto or a CPU number");
  }
  if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed)) {
    return Invalid(value, "is not a CPU this thread may run on");
  }
  return cpu;
}

absl::StatusOr<int> CallsCpuFromEnv() {
  const char* env = std::getenv("AGENTIX_CALLS_CPU");
  return ParseCallsCpu(env == nullptr || *env == '\0' ? kDefaultCallsCpu : env);
}

PinBudget::PinBudget(Hooks hooks) : hooks_(std::move(hooks)) {
  if (!hooks_.run_queue_wait) hooks_.run_queue_wait = base::ThreadRunQueueWait;
  if (!hooks_.now) hooks_.now = absl::Now;
}

bool PinBudget::MayPin() {
  if (resting_) {
    if (!backoff_.Over(hooks_.now())) return false;
    resting_ = false;
    started_ = false;  // the wait while resting is not the pins'
  }
  if (!started_) {
    started_ = true;
    pins_ = 0;
    mark_ = hooks_.run_queue_wait();
  }
  if (++pins_ < kSamplePins) return true;
  const absl::Duration wait = hooks_.run_queue_wait();
  resting_ = backoff_.NotePinned(pins_, wait - mark_, hooks_.now());
  pins_ = 0;
  mark_ = wait;
  return !resting_;
}

bool ThreadPin::Pin(int cpu) {
  if (tid_ != 0 || cpu < 0 || cpu >= CPU_SETSIZE) return false;
  thread_local PinBudget budget;
  if (!budget.MayPin()) return false;
  CPU_ZERO(&original_);
  if (::sched_getaffinity(0, sizeof(original_), &original_) != 0) return false;
  if (CPU_COUNT(&original_) == 1 && CPU_ISSET(cpu, &original_)) return false;  // already
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (::sched_setaffinity(0, sizeof(one), &one) != 0) return false;
  tid_ = ::gettid();
  return true;
}

void ThreadPin::Unpin() {
  if (tid_ == 0) return;
  // Fails only if the thread ended meanwhile: nothing is left to restore.
  ::sched_setaffinity(tid_, sizeof(original_), &original_);
  tid_ = 0;
}

}  // namespace agentix::client_internal
