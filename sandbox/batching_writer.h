// BatchingWriter: the write side of one server bidi stream, shared by the
// Calls and Logs streams. Producers on any thread hand it items; it keeps at
// most one write in flight and puts everything queued meanwhile into the next
// message (at most kMaxBatchBytes, wire_limits.h), which is what makes many small
// events cheap. With coalescing on (the Logs and Traces streams) it also
// holds a small message back for a moment during a burst, because every
// message costs the host a fixed 300-500 µs of Python however few items it
// carries (docs/DECISIONS.md).
//
// Threading: Enqueue() runs on worker reader threads and the daemon's
// completion-queue thread; StartWrite and Finish are called outside mu_, so
// that thread's reactions (which take mu_) never wait behind a producer
// that is inside gRPC. Finish is only ever called
// while no write is in flight, so OnDone (which deletes the reactor) cannot
// race a StartWrite that was decided under the lock. After Detach() every
// Enqueue() is refused.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "sandbox/server_stream.h"
#include "wire/wire_limits.h"

namespace agentix::sandbox {

// How a writer puts borrowed items into its Response (see FillBatch):
// `Field::Borrow(Response&, const Item*)` adds one without copying or owning
// it, `Field::GiveBack(Response&)` removes them all without freeing them,
// `Field::ItemBytes(const Item&)` is an item's serialized size and
// `Field::CachedItemBytes` the same once ItemBytes computed it. For a
// protobuf Response, derive from RepeatedMessageField, e.g.
// `struct Events : RepeatedMessageField<Events> { static auto* Get(
//    CallsResponse& r) { return r.mutable_events(); } };`.
template <typename Derived>
struct RepeatedMessageField {
  template <typename Response, typename Item>
  static void Borrow(Response& response, const Item* item) {
    Derived::Get(response)->UnsafeArenaAddAllocated(const_cast<Item*>(item));
  }
  template <typename Response>
  static void GiveBack(Response& response) {
    auto* field = Derived::Get(response);
    while (!field->empty()) field->UnsafeArenaReleaseLast();
  }
  template <typename Item>
  static size_t ItemBytes(const Item& item) {
    return item.ByteSizeLong();
  }
  // Protobuf's cached sizes are atomic: reading them races nothing.
  template <typename Item>
  static size_t CachedItemBytes(const Item& item) {
    return static_cast<size_t>(item.GetCachedSize());
  }
};

template <typename Request, typename Response, typename Item, typename Field>
class BatchingWriter {
 public:
  using Reactor = ServerStream<Request, Response>;
  using ItemPtr = std::shared_ptr<const Item>;

  // `header` holds the non-repeated fields every message carries.
  explicit BatchingWriter(Reactor* reactor, Response header = Response())
      : reactor_(reactor), batch_(std::move(header)) {}
  virtual ~BatchingWriter() {
    ReleaseBatch();
    absl::MutexLock lock(&mu_);
    ClearQueue();
  }

  // Coalescing: a message that would carry less than `min_bytes` is not
  // written sooner than `delay` after the previous one; the items wait (at
  // most `delay`) and go out together. An item arriving after `delay` of
  // quiet goes out at once, so a lone record is never delayed.
  // `schedule_flush(when)` must arrange a call to WriteHeldBack() at `when`.
  // Times are monotonic (a wall-clock step must not hold items back).
  // With `max_delay` above `delay`, each message that was held back its
  // whole delay (a burst goes on) doubles the delay, up to `max_delay`, also
  // when a new item finds those items still waiting for a late flush; an
  // item that finds nothing waiting and the delay passed since the last
  // write (a quiet moment) goes at once and resets it.
  using Clock = std::chrono::steady_clock;
  struct Coalescing {
    Clock::duration delay;
    size_t min_bytes = 0;
    std::function<void(Clock::time_point)> schedule_flush;
    Clock::duration max_delay = Clock::duration::zero();
  };
  // Turns coalescing on; before the first Enqueue.
  void SetCoalescing(Coalescing coalescing) {
    absl::MutexLock lock(&mu_);
    delay_now_ = coalescing.delay;
    coalescing_ = std::move(coalescing);
  }

  // The coalescing delay in force now (tests).
  Clock::duration CoalescingDelay() {
    absl::MutexLock lock(&mu_);
    return delay_now_;
  }

  // Caps one message at `bytes` serialized (default and most kMaxBatchBytes);
  // an item bigger than that alone still goes alone. Each stream holds its
  // message in flight serialized, so streams that may be many and idle use
  // small ones. Before the first Enqueue.
  void SetMaxBatchBytes(size_t bytes) {
    absl::MutexLock lock(&mu_);
    max_batch_bytes_ = std::min(bytes, kMaxBatchBytes);
  }

  // Adds every change of this writer's unwritten bytes to `*total` (shared
  // by the writers whose backlog is bounded together). Before the first
  // Enqueue; `total` must outlive this writer (hence shared).
  void ShareQueuedBytes(std::shared_ptr<std::atomic<int64_t>> total) {
    absl::MutexLock lock(&mu_);
    shared_queued_ = std::move(total);
  }

  // Bytes waiting to be written (not counting the write in flight).
  size_t QueuedBytes() {
    absl::MutexLock lock(&mu_);
    return queued_bytes_;
  }

  // Queues `items` in order; returns false once the stream has ended.
  bool Enqueue(std::vector<ItemPtr> items) {
    return Offer(std::move(items), SIZE_MAX) == Offered::kQueued;
  }

  enum class Offered { kQueued, kBacklogged, kEnded };
  // Enqueue, unless more than `high_bytes` already wait to be written (a
  // peer reading slower than the producer): then none of `items` is queued
  // (kBacklogged; the producer keeps them) and OnBacklogCleared() runs once
  // the backlog falls below a quarter of `high_bytes`, for the producer to
  // offer them again. A backlog is thus bounded by `high_bytes` plus one
  // offer, without ending the stream (see WatchBacklogStall for a peer
  // that stops reading). kEnded once the stream has ended.
  Offered Offer(std::vector<ItemPtr> items, size_t high_bytes) {
    Reactor* reactor;
    {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr || finished_ || cancelled_ || failure_) {
        return Offered::kEnded;
      }
      if (queued_bytes_ > high_bytes) {
        resume_below_ = high_bytes / 4;
        if (!backlog_paused_) {
          backlog_paused_ = true;
          backlog_progress_ = Clock::now();
        }
        if (stall_.has_value() && !stall_check_pending_) {
          stall_check_pending_ = true;
          stall_->schedule_check(backlog_progress_ + stall_->limit);
        }
        return Offered::kBacklogged;
      }
      // Items already queued here were held back for coalescing and their
      // flush has not run yet (a write in flight returns below).
      const bool held_back = !queue_.empty();
      size_t added = 0;
      for (auto& item : items) {
        added += Field::ItemBytes(*item);
        queue_.push_back(std::move(item));
      }
      AddQueued(static_cast<int64_t>(added));
      reactor = reactor_;
      // OnWriteDone, WriteFirst or WriteHeldBack picks them up.
      if (write_in_flight_ || awaiting_first_ || HoldBack()) {
        return Offered::kQueued;
      }
      // Not held back for want of time. With items that waited their
      // whole delay (the flush is late: a loaded machine's timer) the
      // burst goes on, as in WriteHeldBack; only an item that finds
      // nothing waiting found a quiet moment, which ends a burst.
      if (coalescing_.has_value() && !urgent_ &&
          queued_bytes_ < coalescing_->min_bytes) {
        if (held_back) {
          GrowDelay();
        } else {
          delay_now_ = coalescing_->delay;
        }
      }
      StartBatch();
    }
    reactor->StartWrite(&batch_);
    return Offered::kQueued;
  }

  // A refused Offer (kBacklogged) starts a watch: `schedule_check(when)`
  // must arrange a call to EndIfBacklogStalled at `when` (monotonic), which
  // ends the stream if the peer has still read nothing (no write completed)
  // for `limit` since the refusal or its last read, or else schedules the
  // next check. One check is pending at most. Before the first Offer.
  struct StallWatch {
    Clock::duration limit;
    std::function<void(Clock::time_point)> schedule_check;
  };
  void WatchBacklogStall(StallWatch watch) {
    absl::MutexLock lock(&mu_);
    stall_ = std::move(watch);
  }

  // The watch's check (see WatchBacklogStall), at `now`: true when it ended
  // the stream with `status` (as Fail does; OnBacklogCleared will not run);
  // false when the backlog cleared, the stream had ended, or the peer read
  // within the limit (the next check is then scheduled).
  bool EndIfBacklogStalled(Clock::time_point now, grpc::Status status) {
    std::optional<grpc::Status> finish;
    Reactor* reactor;
    {
      absl::MutexLock lock(&mu_);
      if (!stall_.has_value()) return false;
      const bool ended =
          reactor_ == nullptr || finished_ || cancelled_ || failure_;
      if (ended || !backlog_paused_) {
        stall_check_pending_ = false;
        return false;
      }
      const Clock::time_point due = backlog_progress_ + stall_->limit;
      if (now < due) {
        stall_->schedule_check(due);
        return false;
      }
      stall_check_pending_ = false;
      failure_ = std::move(status);
      ClearQueue();
      reactor = reactor_;
      finish = TakeFinish();
    }
    FinishOutsideLock(finish, reactor);
    return true;
  }

  // Writes what coalescing held back (see Coalescing), if nothing else has.
  void WriteHeldBack() {
    Reactor* reactor;
    {
      absl::MutexLock lock(&mu_);
      flush_scheduled_ = false;
      // Another write may have gone since this flush was scheduled: then
      // HoldBack holds the items again (and schedules the next flush).
      if (reactor_ == nullptr || finished_ || cancelled_ || failure_ ||
          write_in_flight_ || awaiting_first_ || queue_.empty() ||
          HoldBack()) {
        return;
      }
      // These items waited the whole delay: a burst, which the next
      // message may gather for longer.
      if (coalescing_.has_value() && !urgent_) GrowDelay();
      reactor = StartBatch();
    }
    reactor->StartWrite(&batch_);
  }

  // Writes the queued items now, even if coalescing would hold them back;
  // items queued while that write is in flight follow it at once too.
  void WriteNow() {
    Reactor* reactor;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) return;
      urgent_ = true;
      if (reactor_ == nullptr || finished_ || cancelled_ || failure_ ||
          write_in_flight_ || awaiting_first_) {
        return;
      }
      reactor = StartBatch();
    }
    reactor->StartWrite(&batch_);
  }

  // Sets the non-repeated fields every later message carries. Only before
  // the first write (the stream's handshake decides them).
  void SetHeader(Response header) {
    absl::MutexLock lock(&mu_);
    if (!write_in_flight_) batch_ = std::move(header);
  }

  // Makes items enqueued from now on wait until WriteFirst has written the
  // stream's handshake message.
  void HoldUntilFirst() {
    absl::MutexLock lock(&mu_);
    awaiting_first_ = true;
  }

  // Writes `first` (a handshake message outside the batching) before
  // anything queued; queued items follow it.
  void WriteFirst(Response first) {
    Reactor* reactor;
    {
      absl::MutexLock lock(&mu_);
      awaiting_first_ = false;
      if (reactor_ == nullptr || finished_ || cancelled_ || failure_ ||
          write_in_flight_) {
        return;
      }
      first_ = std::move(first);
      write_in_flight_ = true;
      reactor = reactor_;
    }
    reactor->StartWrite(&first_);
  }

  // Ends the stream with `status` (not OK) as soon as no write is in
  // flight; queued items are discarded and later Enqueues refused.
  void Fail(grpc::Status status) {
    UpdateAndMaybeFinish([&] {
      if (!failure_) failure_ = std::move(status);
      ClearQueue();
    });
  }

  // Back-pressure on a peer that does not read: true (and remembered) when
  // more than `high_bytes` wait to be written, in which case the caller
  // stops reading the stream; OnBacklogCleared() runs once the backlog
  // falls below a quarter of that.
  bool PauseReadsIfBacklogged(size_t high_bytes) {
    absl::MutexLock lock(&mu_);
    if (queued_bytes_ <= high_bytes || finished_ || cancelled_) return false;
    resume_below_ = high_bytes / 4;
    backlog_paused_ = true;
    return true;
  }

  // Reactor hooks.
  void OnWriteDone(bool ok) {
    Reactor* reactor = nullptr;
    std::optional<grpc::Status> finish;
    bool write_next = false;
    bool backlog_cleared = false;
    {
      absl::MutexLock lock(&mu_);
      reactor = reactor_;
      if (!ok) cancelled_ = true;  // the stream is broken
      write_next = !cancelled_ && !failure_ && !queue_.empty() &&
                   !HoldBack() && FillBatch();
      if (write_next) {
        last_write_ = Clock::now();
      } else {
        write_in_flight_ = false;
        finish = TakeFinish();
      }
      if (backlog_paused_ && ok) backlog_progress_ = Clock::now();
      if (backlog_paused_ && !cancelled_ && !finished_ && !failure_ &&
          queued_bytes_ < resume_below_) {
        backlog_paused_ = false;
        backlog_cleared = true;
      }
    }
    if (backlog_cleared) OnBacklogCleared();
    if (write_next) {
      reactor->StartWrite(&batch_);
    } else {
      FinishOutsideLock(finish, reactor);
    }
  }
  // The host half-closed: finish once nothing remains (see ReadyToFinish).
  void OnReadsDone() { UpdateAndMaybeFinish([this] { reads_done_ = true; }); }
  // Something ReadyToFinish depends on changed: a half-closed stream
  // finishes now if it may.
  void MaybeFinish() { UpdateAndMaybeFinish([] {}); }
  // The RPC was cancelled: finish as soon as no write is in flight.
  void OnCancel() { UpdateAndMaybeFinish([this] { cancelled_ = true; }); }
  // The reactor is gone (OnDone).
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
    ClearQueue();
  }

 protected:
  // Whether a half-closed stream may finish now (nothing queued, no write in
  // flight). Called with mu_ held; must not call back into this object.
  virtual bool ReadyToFinish() { return true; }
  // Called (outside the lock, on the reaction thread) when reads paused by
  // PauseReadsIfBacklogged may resume, or when the producer whose Offer
  // was refused may offer again.
  virtual void OnBacklogCleared() {}

 private:
  template <typename Update>
  void UpdateAndMaybeFinish(Update update) {
    std::optional<grpc::Status> finish;
    Reactor* reactor;
    {
      absl::MutexLock lock(&mu_);
      update();
      reactor = reactor_;
      finish = TakeFinish();
    }
    FinishOutsideLock(finish, reactor);
  }

  // Whether coalescing holds the queued items back now; if so, a call of
  // WriteHeldBack is scheduled (once) for when they may go.
  // Doubles the coalescing delay up to its max_delay (a burst goes on).
  void GrowDelay() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (coalescing_->max_delay > delay_now_) {
      delay_now_ = std::min(delay_now_ * 2, coalescing_->max_delay);
    }
  }

  bool HoldBack() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!coalescing_.has_value() || urgent_ ||
        queued_bytes_ >= coalescing_->min_bytes) {
      return false;
    }
    const Clock::time_point may_write = last_write_ + delay_now_;
    if (Clock::now() >= may_write) return false;
    if (!flush_scheduled_) {
      flush_scheduled_ = true;
      coalescing_->schedule_flush(may_write);
    }
    return true;
  }

  // Fills batch_ from the queue (not empty) for a write the caller starts
  // after releasing mu_; returns the reactor to start it on.
  Reactor* StartBatch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    FillBatch();
    write_in_flight_ = true;
    last_write_ = Clock::now();
    return reactor_;
  }

  // Moves queued items into batch_; returns false if nothing is queued.
  // The message *borrows* the items (the producers may retain the same
  // objects), so a megabyte chunk is not copied once more per write;
  // serialising only reads them.
  // The message never exceeds max_batch_bytes_ serialized (header, tags and
  // lengths counted) unless its one item alone does.
  bool FillBatch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ReleaseBatch();
    size_t bytes = batch_.ByteSizeLong();  // the header fields
    while (!queue_.empty()) {
      // Enqueue computed it (items are immutable once queued).
      const size_t size = Field::CachedItemBytes(*queue_.front());
      if (!batch_refs_.empty() &&
          bytes + FramedItemBytes(size) > max_batch_bytes_) {
        break;
      }
      ItemPtr item = std::move(queue_.front());
      queue_.pop_front();
      bytes += FramedItemBytes(size);
      AddQueued(-static_cast<int64_t>(std::min(queued_bytes_, size)));
      Field::Borrow(batch_, item.get());
      batch_refs_.push_back(std::move(item));
    }
    if (queue_.empty()) urgent_ = false;
    return !batch_refs_.empty();
  }

  // Gives the borrowed items back without freeing them. Must run before
  // batch_ is reused or destroyed.
  void ReleaseBatch() {
    Field::GiveBack(batch_);
    batch_refs_.clear();
  }

  void AddQueued(int64_t delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    queued_bytes_ = static_cast<size_t>(static_cast<int64_t>(queued_bytes_) + delta);
    if (shared_queued_) shared_queued_->fetch_add(delta, std::memory_order_relaxed);
  }
  void ClearQueue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    queue_.clear();
    AddQueued(-static_cast<int64_t>(queued_bytes_));
  }

  std::optional<grpc::Status> TakeFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || write_in_flight_ || reactor_ == nullptr) {
      return std::nullopt;
    }
    if (cancelled_) {
      finished_ = true;
      return grpc::Status::CANCELLED;
    }
    if (failure_) {
      finished_ = true;
      return *failure_;
    }
    if (!reads_done_ || !queue_.empty() || !ReadyToFinish()) {
      return std::nullopt;
    }
    finished_ = true;
    return grpc::Status::OK;
  }

  static void FinishOutsideLock(std::optional<grpc::Status> status,
                                Reactor* reactor) {
    if (status.has_value()) reactor->Finish(*status);
  }

  absl::Mutex mu_;
  Reactor* reactor_ ABSL_GUARDED_BY(mu_);
  std::deque<ItemPtr> queue_ ABSL_GUARDED_BY(mu_);
  Response batch_;                  // the message of the write in flight
  Response first_;                  // WriteFirst's message
  std::vector<ItemPtr> batch_refs_;  // keeps batch_'s borrowed items alive
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> failure_ ABSL_GUARDED_BY(mu_);
  bool awaiting_first_ ABSL_GUARDED_BY(mu_) = false;
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // serialized size of queue_
  // PauseReadsIfBacklogged or Offer paused something until the backlog
  // falls below resume_below_.
  bool backlog_paused_ ABSL_GUARDED_BY(mu_) = false;
  size_t resume_below_ ABSL_GUARDED_BY(mu_) = 0;
  // While backlog_paused_: when it paused or a write last completed.
  Clock::time_point backlog_progress_ ABSL_GUARDED_BY(mu_);
  std::optional<StallWatch> stall_ ABSL_GUARDED_BY(mu_);
  bool stall_check_pending_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<Coalescing> coalescing_ ABSL_GUARDED_BY(mu_);
  Clock::duration delay_now_ ABSL_GUARDED_BY(mu_) = Clock::duration::zero();
  size_t max_batch_bytes_ ABSL_GUARDED_BY(mu_) = kMaxBatchBytes;
  std::shared_ptr<std::atomic<int64_t>> shared_queued_ ABSL_GUARDED_BY(mu_);
  Clock::time_point last_write_ ABSL_GUARDED_BY(mu_) = Clock::time_point::min();
  bool flush_scheduled_ ABSL_GUARDED_BY(mu_) = false;
  // WriteNow asked for the queued items to go without coalescing delay.
  bool urgent_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace agentix::sandbox
