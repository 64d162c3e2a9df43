// The durable log file written through a MAP_SHARED mapping instead of one
// write(2) per record: a record copied into the mapping is in the page cache
// at once, so a worker killed by SIGKILL or the OOM killer still leaves it
// in the file (the promise write() per record kept), for a memcpy instead of
// a system call.
//
// Only a window of about kChunk bytes at the file's end is mapped (its pages
// are all the memory this holds); the file grows with it, reserved with
// posix_fallocate (a full disk is an error here, not a SIGBUS on a later
// copy). Close() truncates it to what was written. After a crash the file ends in NUL bytes up to the next
// chunk boundary; Open() of such a file (the next worker of that id) trims
// them, and readers must stop at the first NUL after the last newline.
// A forked child inherits the mapping but not the ownership: its Append and
// Close fail / only unmap, so it never writes over or truncates the parent's
// records.
//
// Once kPrefaultAfter bytes have been appended, each window's pages are
// faulted in ahead of the writer by a thread of the log's own
// (MADV_POPULATE_WRITE, then a read of each page): on a VM a first write to a
// fresh page of the mapping costs the writer ~9-15 µs (the guest's fault and
// the hypervisor's), about 0.2-0.35 µs a record, on the thread that logs. A
// log that stays small (a worker's boot, a quiet sandbox) starts no thread.
// The prefaulter only reads; the writer unmaps a window only after it has
// let go of it.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace agentix::worker {

class MappedLog {
 public:
  static constexpr size_t kChunk = size_t{1} << 20;
  static constexpr size_t kPrefaultAfter = 64 * 1024;

  // Maps the regular file open for reading and writing on `fd` (not owned;
  // keep it open until Close), appending after its content with a previous
  // crash's NUL tail (at most kChunk bytes) trimmed off.
  // `prefault`: past kPrefaultAfter bytes, fault each window's pages in on
  // the log's own thread (off: the writer takes every page's first-write
  // fault itself).
  static absl::StatusOr<std::unique_ptr<MappedLog>> Open(int fd,
                                                         bool prefault = true);

  MappedLog(const MappedLog&) = delete;
  MappedLog& operator=(const MappedLog&) = delete;
  // Unmaps without truncating (what a crash leaves); Close() first.
  ~MappedLog();

  // Copies `data` after what was written, growing the file first if needed.
  absl::Status Append(std::string_view data);
  // Unmaps and truncates the file to Length() (in a forked child: only
  // unmaps). Later Appends fail.
  absl::Status Close();
  // The bytes of the file that are records (its size after Close).
  size_t Length() const { return length_; }

 private:
  class Prefaulter;

  MappedLog(int fd, size_t length, unsigned generation, bool prefault)
      : fd_(fd), length_(length), generation_(generation), prefault_(prefault) {}
  bool InheritedByFork() const;
  // Maps a window from the end of the records that holds `bytes` more.
  absl::Status Slide(size_t bytes);
  // Unmaps the window, after the prefaulter has let go of it.
  void Unmap();
  // Starts the prefaulter on the rest of the window.
  void StartPrefaulting();

  int fd_;
  size_t length_;
  unsigned generation_;  // of forks, when opened
  char* base_ = nullptr;  // the window: file bytes [offset_, offset_ + mapped_)
  size_t offset_ = 0;
  size_t mapped_ = 0;
  bool closed_ = false;
  bool prefault_;
  size_t appended_ = 0;  // by this object, counted until the prefaulter starts
  // Started past kPrefaultAfter bytes; in a forked child (where its thread does
  // not exist) never stopped nor freed.
  Prefaulter* prefaulter_ = nullptr;
};

}  // namespace agentix::worker
