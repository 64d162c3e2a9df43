#include "agentix/calls_cpu.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
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

bool CallsCpuFollowsDaemon() {
  const char* env = std::getenv("AGENTIX_CALLS_CPU");
  return env == nullptr || *env == '\0';
}

bool PinBudget::MayPin(bool* timed) {
  *timed = false;
  if (RestsNow()) return false;
  *timed = ++pins_ % kTimeEvery == 0;
  return true;
}

void PinBudget::NoteTimed(absl::Duration wait) {
  timed_wait_ += wait;
  if (++timed_ < kTimedPerJudgement) return;
  // A thread's first judgement holds its connecting and warming up, not
  // the steady state: it is not judged (as the daemon's first sample).
  if (judged_) resting_ = backoff_.NotePinned(timed_, timed_wait_, now_());
  judged_ = true;
  timed_ = 0;
  timed_wait_ = absl::ZeroDuration();
}

bool PinBudget::RestsNow() {
  if (resting_ && backoff_.Over(now_())) resting_ = false;
  return resting_;
}

void PinTrial::Begin(absl::Time now) {
  if (block_ >= 0) return;
  ++lone_calls_;
  const bool due = first_done_ ? now >= next_at_ : lone_calls_ > kFirstAfter;
  if (!due) return;
  block_ = 0;
  in_block_ = 0;
  samples_[0].clear();
  samples_[1].clear();
}

namespace {

absl::Duration Median(std::vector<absl::Duration>& times) {
  const size_t middle = times.size() / 2;
  std::nth_element(times.begin(), times.begin() + middle, times.end());
  if (times.size() % 2 == 1) return times[middle];
  const absl::Duration upper = times[middle];
  const absl::Duration lower = *std::max_element(times.begin(), times.begin() + middle);
  return (lower + upper) / 2;
}

}  // namespace

void PinTrial::End(absl::Duration took, absl::Time now) {
  if (block_ < 0) return;
  if (in_block_ >= kSkip) samples_[PinsNow() ? 1 : 0].push_back(took);
  if (++in_block_ < kBlock) return;
  in_block_ = 0;
  if (++block_ < kBlocks) return;
  last_unpinned_ = Median(samples_[0]);
  last_pinned_ = Median(samples_[1]);
  // Pinned stays on a tie: its rarest calls are the faster ones.
  pin_ = !(absl::FDivDuration(last_unpinned_, last_pinned_) < kMargin);
  block_ = -1;
  first_done_ = true;
  next_at_ = now + every_;
  every_ = std::min(every_ * 2, kEvery);
}

PinBudget& ThreadPinBudget() {
  thread_local PinBudget budget;
  return budget;
}

PinTrial& ThreadPinTrial() {
  thread_local PinTrial trial;
  return trial;
}

bool ThreadPin::Pin(int cpu) {
  if (tid_ != 0 || cpu < 0 || cpu >= CPU_SETSIZE) return false;
  PinBudget& budget = ThreadPinBudget();
  bool timed = false;
  if (!budget.MayPin(&timed)) return false;
  CPU_ZERO(&original_);
  if (::sched_getaffinity(0, sizeof(original_), &original_) != 0) return false;
  if (CPU_COUNT(&original_) == 1 && CPU_ISSET(cpu, &original_)) return false;  // already
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (::sched_setaffinity(0, sizeof(one), &one) != 0) return false;
  tid_ = ::gettid();
  timing_ = timed ? &budget : nullptr;
  if (timed) wait_at_pin_ = base::ThreadRunQueueWait();
  return true;
}

void ThreadPin::Unpin() {
  if (tid_ == 0) return;
  // Read before the mask changes back (the pinned thread's, from any thread:
  // it is blocked in its wait, so its budget is not in use meanwhile).
  if (timing_ != nullptr) {
    timing_->NoteTimed(base::ThreadRunQueueWait(tid_) - wait_at_pin_);
    timing_ = nullptr;
  }
  // Fails only if the thread ended meanwhile: nothing is left to restore.
  ::sched_setaffinity(tid_, sizeof(original_), &original_);
  tid_ = 0;
}

}  // namespace agentix::client_internal
