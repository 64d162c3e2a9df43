// See calls_reactor.h.
#include "host/python/native/calls_reactor.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <thread>

namespace agentix::host {
namespace {

// With coalescing, queued writes are joined into one message up to this
// size; one larger write goes alone.
constexpr size_t kCoalesceBytes = 4 << 20;

// The process's one completion queue for these streams, and the thread that
// polls it: created on first use, never shut down (it holds gRPC's library
// reference, so gRPC is not torn down under a reactor at interpreter exit).
grpc::CompletionQueue* SharedQueue() {
  static grpc::CompletionQueue* const queue = [] {
    auto* cq = new grpc::CompletionQueue;
    std::thread([cq] {
      void* tag;
      bool ok;
      while (cq->Next(&tag, &ok)) CallsReactor::Complete(tag, ok);
    }).detach();
    return cq;
  }();
  return queue;
}

}  // namespace

CallsReactor::CallsReactor(int efd, std::string method, bool coalesce)
    : efd_(efd), method_(std::move(method)), coalesce_(coalesce) {
  for (int op = 0; op < kOps; ++op) tags_[op] = {this, static_cast<Op>(op)};
}

CallsReactor::~CallsReactor() { close(efd_); }

void CallsReactor::Cancel() { context_.TryCancel(); }

void CallsReactor::Start(std::shared_ptr<grpc::Channel> channel, const Metadata& metadata) {
  for (const auto& [key, value] : metadata) context_.AddMetadata(key, value);
  channel_ = std::move(channel);
  stub_ = std::make_unique<grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer>>(channel_);
  stream_ = stub_->PrepareCall(&context_, method_, SharedQueue());
  {
    std::lock_guard<std::mutex> lock(mu_);
    started_ = true;
    ops_ = 2;  // the start and the first read
    // grpc++ sends the initial metadata with the op set its writes use:
    // writes wait for the start as for a write in flight.
    writing_ = true;
    inflight_bytes_ = 0;
  }
  stream_->StartCall(Tag(Op::kStart));
  stream_->Read(&read_buf_, Tag(Op::kRead));
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
    ++ops_;
  }
  stream_->Write(write_buf_, Tag(Op::kWrite));
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<long long>(pending_bytes_);
}

void CallsReactor::WritesDone() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (dead_ || writes_done_requested_) return;
    writes_done_requested_ = true;
    if (writing_) return;  // the write's completion starts it
    writes_done_inflight_ = true;
    ++ops_;
  }
  stream_->WritesDone(Tag(Op::kWritesDone));
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
    if (!started_) --refs_;  // no operation will ever complete
    last = --refs_ == 0;
  }
  if (last) delete this;
}

void CallsReactor::Complete(void* tag, bool ok) {
  const auto* completion = static_cast<const Completion*>(tag);
  CallsReactor* reactor = completion->reactor;
  switch (completion->op) {
    case Op::kStart:  // a write of no bytes (see Start)
    case Op::kWrite:
      reactor->OnWriteDone(ok);
      break;
    case Op::kRead:
      reactor->OnReadDone(ok);
      break;
    case Op::kWritesDone:
      reactor->OnWritesDoneDone(ok);
      break;
    case Op::kFinish:
      reactor->OnFinished();
      break;
  }
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
      stream_->Read(&read_buf_, Tag(Op::kRead));  // the op count stays
      return;
    }
    context_.TryCancel();
  }
  // No more messages: the call is over (or cancelled); ask for its status.
  {
    std::lock_guard<std::mutex> lock(mu_);
    dead_ = true;
  }
  stream_->Finish(&status_, Tag(Op::kFinish));  // replaces the read in the count
}

void CallsReactor::OnWriteDone(bool ok) {
  bool start_write = false, start_writes_done = false;
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
      while (!queue_.empty() && (slices.empty() || (coalesce_ && size + queue_.front().size() <= kCoalesceBytes))) {
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
    }
    if (start_write || start_writes_done) ++ops_;
    CheckNotifyLocked();
  }
  if (start_write) stream_->Write(write_buf_, Tag(Op::kWrite));
  if (start_writes_done) stream_->WritesDone(Tag(Op::kWritesDone));
  OpDone();
}

void CallsReactor::OnWritesDoneDone(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    writes_done_inflight_ = false;
    if (!ok) dead_ = true;
    CheckNotifyLocked();
  }
  OpDone();
}

void CallsReactor::OnFinished() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    dead_ = true;
    status_code_ = status_.error_code();
    status_message_ = status_.error_message();
    SignalLocked();
  }
  OpDone();
}

void CallsReactor::OpDone() {
  bool last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The last operation of a finished call: no completion will name this
    // reactor again, so the polling thread's reference goes.
    last = --ops_ == 0 && done_ && --refs_ == 0;
  }
  if (last) delete this;
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

}  // namespace agentix::host
