#include "sandbox/log_buffer.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include <fmt/format.h>

#include "base/log.h"

namespace agentix::sandbox {

using runtime::v1::LogRecord;

namespace {

LogRecord FromEntry(const ipc::LogEntry& e, const std::string& worker_id) {
  LogRecord r;
  r.set_logger(e.logger);
  r.set_level(e.level);
  r.set_level_name(e.level_name);
  r.set_message(e.message);
  r.set_time_unix_nanos(e.time_unix_nanos);
  r.set_file(e.file);
  r.set_line(e.line);
  r.set_function(e.function);
  r.set_module(e.module);
  r.set_exception_text(e.exception_text);
  r.set_origin(static_cast<runtime::v1::LogOrigin>(e.origin));
  r.set_worker_id(worker_id);
  r.set_call_id(e.call_id);
  r.set_context(e.context);
  r.set_extras(e.extras);
  r.set_stack_info(e.stack_info);
  return r;
}

int64_t NowUnixNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string RandomInstanceId() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

LogBuffer::LogBuffer(size_t capacity)
    : capacity_(std::max<size_t>(1, capacity)),
      instance_id_(RandomInstanceId()) {}

LogRecordPtr LogBuffer::Store(LogRecord record) {
  record.set_seq(next_seq_++);
  auto ptr = std::make_shared<const LogRecord>(std::move(record));
  backlog_.push_back(ptr);
  while (backlog_.size() > capacity_) {
    backlog_.pop_front();
    ++unreported_drops_;
    if (dropped_total_++ % 1000 == 0) {
      AGX_LOG(Warning,
              "log buffer full ({} records, nobody acknowledging): dropping "
              "the oldest; {} dropped so far",
              capacity_, dropped_total_);
    }
  }
  return ptr;
}

void LogBuffer::ReportDrops(std::vector<LogRecordPtr>& out) {
  if (unreported_drops_ == 0) return;
  // Storing the warning in a full backlog evicts one more record: count it.
  const uint64_t dropped =
      unreported_drops_ + (backlog_.size() >= capacity_ ? 1 : 0);
  LogRecord warning;
  warning.set_logger("agentix.sandbox");
  warning.set_level(30);
  warning.set_level_name("WARNING");
  warning.set_message(absl::StrCat(
      dropped,
      " sandbox log records were dropped: the daemon's log buffer (",
      capacity_, " records) filled up before a host received them"));
  warning.set_time_unix_nanos(NowUnixNanos());
  warning.set_origin(runtime::v1::LOG_ORIGIN_RUNTIME);
  out.push_back(Store(std::move(warning)));
  unreported_drops_ = 0;
}

void LogBuffer::Append(const ipc::LogEntry& entry,
                       const std::string& worker_id) {
  Append(std::vector<ipc::LogEntry>{entry}, worker_id);
}

void LogBuffer::Append(const std::vector<ipc::LogEntry>& entries,
                       const std::string& worker_id) {
  std::vector<LogRecordPtr> records;
  std::vector<std::shared_ptr<LogSubscriber>> subscribers;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& e : entries) {
      records.push_back(Store(FromEntry(e, worker_id)));
    }
    if (subscribers_.empty()) return;  // kept in the backlog
    // Overflow can only happen here with subscribers that do not ack; they
    // learn about it in the same delivery.
    ReportDrops(records);
    subscribers = subscribers_;
  }
  for (auto& s : subscribers) s->Deliver(records);
}

void LogBuffer::Subscribe(const std::shared_ptr<LogSubscriber>& subscriber,
                          uint64_t after_seq, const std::string& instance_id) {
  if (!instance_id.empty() && instance_id != instance_id_) after_seq = 0;
  std::vector<LogRecordPtr> records;
  {
    absl::MutexLock lock(&mu_);
    subscribers_.push_back(subscriber);
    std::vector<LogRecordPtr> drop_warning;
    ReportDrops(drop_warning);
    for (const auto& r : backlog_) {
      if (r->seq() > after_seq) records.push_back(r);
    }
  }
  if (!records.empty()) subscriber->Deliver(std::move(records));
}

void LogBuffer::Unsubscribe(const LogSubscriber* subscriber) {
  absl::MutexLock lock(&mu_);
  subscribers_.erase(
      std::remove_if(subscribers_.begin(), subscribers_.end(),
                     [&](const auto& s) { return s.get() == subscriber; }),
      subscribers_.end());
}

void LogBuffer::Ack(uint64_t seq) {
  absl::MutexLock lock(&mu_);
  while (!backlog_.empty() && backlog_.front()->seq() <= seq) {
    backlog_.pop_front();
  }
}

size_t LogBuffer::buffered() {
  absl::MutexLock lock(&mu_);
  return backlog_.size();
}

uint64_t LogBuffer::dropped_total() {
  absl::MutexLock lock(&mu_);
  return dropped_total_;
}

}  // namespace agentix::sandbox
