// LogBuffer: the daemon's store of sandbox log records between the worker
// and the hosts subscribed to RuntimeService.Logs. It numbers records (a
// daemon-wide seq that survives worker respawns), keeps a bounded backlog
// until a host acknowledges it, broadcasts to every subscriber, and turns
// overflow into one visible WARNING record instead of a silent loss.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "worker/ipc/frame.h"

namespace agentix::sandbox {

using LogRecordPtr = std::shared_ptr<const runtime::v1::LogRecord>;

// Receives records for one Logs stream.
class LogSubscriber {
 public:
  virtual ~LogSubscriber() = default;
  // Queues `records` (in seq order) for the host. Thread-safe, non-blocking;
  // never called with a LogBuffer lock held.
  virtual void Deliver(std::vector<LogRecordPtr> records) = 0;
};

class LogBuffer {
 public:
  // Keeps at most `capacity` unacknowledged records.
  explicit LogBuffer(size_t capacity);

  // Adds one record from the worker `worker_id`. Thread-safe.
  void Append(const ipc::LogEntry& entry, const std::string& worker_id);
  // The same for several records, delivered together.
  void Append(const std::vector<ipc::LogEntry>& entries,
              const std::string& worker_id);
  // Adds `subscriber` and delivers the backlog with seq > `after_seq`
  // (followed by the drop warning, if records were lost). An `instance_id`
  // that is set and differs from ours means `after_seq` counted in another
  // daemon: the whole backlog is sent. Thread-safe.
  void Subscribe(const std::shared_ptr<LogSubscriber>& subscriber,
                 uint64_t after_seq, const std::string& instance_id = "");
  void Unsubscribe(const LogSubscriber* subscriber);
  // Frees every record with seq <= `seq`.
  void Ack(uint64_t seq);

  // Random per LogBuffer (i.e. per daemon process); see LogsResponse.
  const std::string& instance_id() const { return instance_id_; }

  // For tests and GetInfo.
  size_t buffered();
  uint64_t dropped_total();

 private:
  struct Pending {
    std::vector<std::shared_ptr<LogSubscriber>> subscribers;
    std::vector<LogRecordPtr> records;
  };
  // Adds a record to the backlog, evicting the oldest past capacity.
  LogRecordPtr Store(runtime::v1::LogRecord record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The WARNING record about records lost since the last one, if any.
  void ReportDrops(std::vector<LogRecordPtr>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  const std::string instance_id_;
  absl::Mutex mu_;
  std::deque<LogRecordPtr> backlog_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<LogSubscriber>> subscribers_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t unreported_drops_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace agentix::sandbox
