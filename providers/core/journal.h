// An append-only record file in providerd's state dir: what makes a restart
// lose no sandbox record, request id or warm pool. Each record is framed as
// [u32 length][u32 crc32][payload]; a torn or corrupt tail (kill -9 mid-write)
// is dropped when the file is read, never fatal. Records are keyed: the last
// record of a (type, key) wins, a record with `erase` removes the key. Open()
// reads the file and the owner compacts it at once with Rewrite(), so it
// holds only live state after each start.
//
// Durability: Append is one write(2) (the page cache survives kill -9 of
// providerd); `fsync` also makes it survive a machine crash, at ~ms per
// record.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace agentix::providers {

struct JournalRecord {
  uint8_t type = 0;
  bool erase = false;
  std::string key;
  std::vector<std::string> fields;
};

class Journal {
 public:
  struct Loaded {
    std::vector<JournalRecord> records;  // in file order
    int64_t dropped_bytes = 0;           // a torn/corrupt tail
  };

  // Creates `dir` if needed and reads `dir`/journal.
  static absl::StatusOr<std::unique_ptr<Journal>> Open(const std::string& dir,
                                                       bool fsync,
                                                       Loaded* loaded);
  ~Journal();

  absl::Status Append(const JournalRecord& record);
  // Replaces the file with exactly `live` (write a temp file, rename).
  absl::Status Rewrite(const std::vector<JournalRecord>& live);

  // Folds records by (type, key): the live set, in first-seen order.
  static std::vector<JournalRecord> Fold(std::vector<JournalRecord> records);

  // Exposed for tests: one framed record.
  static std::string Encode(const JournalRecord& record);

  const std::string& path() const { return path_; }

 private:
  Journal(std::string path, int fd, bool fsync)
      : path_(std::move(path)), fd_(fd), fsync_(fsync) {}

  const std::string path_;
  absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_);
  const bool fsync_;
};

}  // namespace agentix::providers
