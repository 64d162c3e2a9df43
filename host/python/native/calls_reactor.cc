// See calls_reactor.h.
#include "host/python/native/calls_reactor.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>

namespace agentix::host {
namespace {

constexpr char kCallsMethod[] = "/agentix.runtime.v1.RuntimeService/Calls";
// Queued writes are joined into one message (a concatenation of serialized
// CallsRequests is a CallsRequest) up to this size; one larger write goes alone.
constexpr size_t kCoalesceBytes = 4 << 20;

// Reactors whose OnDone came after their Detach (see Lifetime in the header).
std::mutex g_parked_mu;
std::vector<CallsReactor*>* g_parked = new std::vector<CallsReactor*>;  // never destroyed
std::atomic<bool> g_any_parked{false};

void Park(CallsReactor* reactor) {
  std::lock_guard<std::mutex> lock(g_parked_mu);
  g_parked->push_back(reactor);
  g_any_parked.store(true, std::memory_order_release);
}

}  // namespace

CallsReactor::CallsReactor(int efd) : efd_(efd) {}

CallsReactor::~CallsReactor() { close(efd_); }

void CallsReactor::Cancel() { context_.TryCancel(); }

bool CallsReactor::AnyParked() { return g_any_parked.load(std::memory_order_acquire); }

void CallsReactor::ReapParked() {
  if (!AnyParked()) return;
  std::vector<CallsReactor*> parked;
  {
    std::lock_guard<std::mutex> lock(g_parked_mu);
    g_any_parked.store(false, std::memory_order_relaxed);
    parked.swap(*g_parked);
  }
  for (CallsReactor* reactor : parked) delete reactor;
}

void CallsReactor::Start(std::shared_ptr<grpc::Channel> channel, const Metadata& metadata) {
    for (const auto& [key, value] : metadata) context_.AddMetadata(key, value);
    stub_ = std::make_unique<grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer>>(std::move(channel));
    stub_->PrepareBidiStreamingCall(&context_, kCallsMethod, grpc::StubOptions(), this);
    AddHold();
    StartRead(&read_buf_);
    StartCall();
  }

long long CallsReactor::Write(grpc::Slice slice) {
    const size_t size = slice.size();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (dead_ || writes_done_requested_) return -1;
      pending_bytes_ += size;
      if (writing_) {
        queue_.push_back(std::move(slice));
        return static_cast<long long>(pending_bytes_);
      }
      writing_ = true;
      inflight_bytes_ = size;
      write_buf_ = grpc::ByteBuffer(&slice, 1);
    }
    StartWrite(&write_buf_);
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<long long>(pending_bytes_);
  }

void CallsReactor::WritesDone() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (dead_ || writes_done_requested_) return;
      writes_done_requested_ = true;
      if (writing_) return;  // OnWriteDone starts it
      writes_done_inflight_ = true;
    }
    StartWritesDone();
  }

long long CallsReactor::Pending() {
    std::lock_guard<std::mutex> lock(mu_);
    return PendingLocked();
  }

void CallsReactor::NotifyBelow(long long threshold) {
    std::lock_guard<std::mutex> lock(mu_);
    notify_below_ = threshold;
    CheckNotifyLocked();
  }

CallsReactor::Drained CallsReactor::Drain() {
    Drained out;
    std::lock_guard<std::mutex> lock(mu_);
    if (signalled_) {
      uint64_t value;
      while (read(efd_, &value, sizeof value) < 0 && errno == EINTR) {
      }
      signalled_ = false;
    }
    out.messages.swap(received_);
    if (done_ && !status_taken_) {
      status_taken_ = true;
      out.has_status = true;
      out.code = status_code_;
      out.message = status_message_;
    }
    out.below = below_fired_;
    below_fired_ = false;
    return out;
  }

void CallsReactor::Detach() {
    context_.TryCancel();  // while still holding our reference
    bool last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = --refs_ == 0;
    }
    if (last) delete this;
  }

void CallsReactor::OnReadDone(bool ok) {
    if (ok) {
      std::vector<grpc::Slice> slices;
      grpc::Status dumped = read_buf_.Dump(&slices);
      read_buf_.Clear();
      if (dumped.ok()) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          received_.push_back(std::move(slices));
          SignalLocked();
        }
        StartRead(&read_buf_);
        return;
      }
      context_.TryCancel();
    }
    bool release;
    {
      std::lock_guard<std::mutex> lock(mu_);
      dead_ = true;
      release = ReleaseLocked();
    }
    if (release) RemoveHold();
  }

void CallsReactor::OnWriteDone(bool ok) {
    bool start_write = false, start_writes_done = false, release = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_bytes_ -= inflight_bytes_;
      inflight_bytes_ = 0;
      if (!ok) {
        dead_ = true;
        queue_.clear();
        pending_bytes_ = 0;
      }
      if (!dead_ && !queue_.empty()) {
        std::vector<grpc::Slice> slices;
        size_t size = 0;
        while (!queue_.empty() && (slices.empty() || size + queue_.front().size() <= kCoalesceBytes)) {
          size += queue_.front().size();
          slices.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
        write_buf_ = grpc::ByteBuffer(slices.data(), slices.size());
        inflight_bytes_ = size;
        start_write = true;
      } else {
        writing_ = false;
        if (!dead_ && writes_done_requested_) {
          writes_done_inflight_ = true;
          start_writes_done = true;
        }
        release = ReleaseLocked();
      }
      CheckNotifyLocked();
    }
    if (start_write) StartWrite(&write_buf_);
    if (start_writes_done) StartWritesDone();
    if (release) RemoveHold();
  }

void CallsReactor::OnWritesDoneDone(bool ok) {
    bool release;
    {
      std::lock_guard<std::mutex> lock(mu_);
      writes_done_inflight_ = false;
      half_closed_ = true;
      if (!ok) dead_ = true;
      release = ReleaseLocked();
      CheckNotifyLocked();
    }
    if (release) RemoveHold();
  }

void CallsReactor::OnDone(const grpc::Status& status) {
    bool last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      dead_ = true;
      status_code_ = status.error_code();
      status_message_ = status.error_message();
      SignalLocked();
      last = --refs_ == 0;
    }
    if (last) Park(this);
  }

long long CallsReactor::PendingLocked() const {
    return static_cast<long long>(pending_bytes_) + (writes_done_inflight_ ? 1 : 0);
  }

void CallsReactor::SignalLocked() {
    if (signalled_) return;
    signalled_ = true;
    uint64_t one = 1;
    while (write(efd_, &one, sizeof one) < 0 && errno == EINTR) {
    }
  }

void CallsReactor::CheckNotifyLocked() {
    if (notify_below_ >= 0 && PendingLocked() <= notify_below_) {
      notify_below_ = -1;
      below_fired_ = true;
      SignalLocked();
    }
  }

bool CallsReactor::ReleaseLocked() {
    if (hold_released_ || writing_ || writes_done_inflight_) return false;
    if (!dead_ && !half_closed_) return false;
    hold_released_ = true;
    return true;
  }

}  // namespace agentix::host
