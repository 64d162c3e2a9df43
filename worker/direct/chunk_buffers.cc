#include "worker/direct/chunk_buffers.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "base/fresh_pages.h"
#include "worker/ipc/chunking.h"

namespace agentix::worker {
namespace {

// Gives the whole pages inside `buffer`'s capacity back to the OS; they read
// as zeros when touched again. The allocation itself stays.
void ReleasePages(std::string& buffer) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto data = reinterpret_cast<uintptr_t>(buffer.data());
  // Past the first byte (the terminator clear() wrote), within capacity.
  const uintptr_t begin = (data + page) & ~(page - 1);
  const uintptr_t end = (data + buffer.capacity()) & ~(page - 1);
  if (begin < end) {
    (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
  }
}

// Faults in, in one system call, the pages of `buffer` that its next `size`
// bytes will be written to, after ReleasePages gave them back: a page fault
// each costs more than the kernel filling the range at once (a 64 MiB
// direct echo writes 16 MiB into released buffers: docs/PERFORMANCE.md,
// "stop-43: the direct 64 MiB echo"). The memory is what those writes would
// fault in anyway.
void PopulatePages(std::string& buffer, size_t size) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto data = reinterpret_cast<uintptr_t>(buffer.data());
  // The pages ReleasePages gave back that the writes reach.
  const uintptr_t begin = (data + page) & ~(page - 1);
  const uintptr_t end =
      std::min((data + size + page - 1) & ~(page - 1),
               (data + buffer.capacity()) & ~(page - 1));
  if (begin < end) {
    (void)base::PopulateForWrite(reinterpret_cast<void*>(begin), end - begin);
  }
}

}  // namespace

std::shared_ptr<ChunkBuffers> ChunkBuffers::Create(size_t max_kept,
                                                   size_t max_faulted) {
  return std::shared_ptr<ChunkBuffers>(
      new ChunkBuffers(max_kept, std::min(max_kept, max_faulted)));
}

std::string ChunkBuffers::Take(size_t size) {
  std::string buffer;
  bool released = false;
  bool fresh = false;
  {
    absl::MutexLock lock(&mu_);
    if (size <= ipc::kChunkBytes && !(faulted_.empty() && released_.empty())) {
      std::vector<std::string>& kept = faulted_.empty() ? released_ : faulted_;
      released = &kept == &released_;
      buffer = std::move(kept.back());
      kept.pop_back();
      ++reused_;
    } else {
      ++fresh_;
      fresh = true;
    }
  }
  if (released) {
    PopulatePages(buffer, size);  // outside the lock: a system call
  } else if (fresh) {
    buffer.reserve(std::max(size, ipc::kChunkBytes));
    // A worker's first large results take fresh ones (a 64 MiB result, 64):
    // filled at once, as the released ones above.
    (void)base::PopulateFreshForWrite(buffer.data(), size);
  }
  return buffer;  // a kept one was cleared by Give, capacity >= kChunkBytes
}

void ChunkBuffers::Give(std::string buffer) {
  if (buffer.capacity() < ipc::kChunkBytes) return;
  buffer.clear();
  {
    absl::MutexLock lock(&mu_);
    if (faulted_.size() < max_faulted_) {
      faulted_.push_back(std::move(buffer));
      return;
    }
    if (faulted_.size() + released_.size() >= max_kept_) return;  // freed
  }
  ReleasePages(buffer);  // outside the lock: a system call
  absl::MutexLock lock(&mu_);
  if (faulted_.size() + released_.size() < max_kept_) {
    released_.push_back(std::move(buffer));
  }
}

std::shared_ptr<runtime::v1::SandboxEvent> ChunkBuffers::ChunkEvent(
    const std::string& call_id, std::string data) {
  auto* event = new runtime::v1::SandboxEvent();
  runtime::v1::ResultChunk* chunk = event->mutable_result_chunk();
  chunk->set_call_id(call_id);
  chunk->set_data(std::move(data));  // the buffer moves, not the bytes
  return std::shared_ptr<runtime::v1::SandboxEvent>(
      event, [buffers = shared_from_this()](runtime::v1::SandboxEvent* e) {
        buffers->Give(std::move(*e->mutable_result_chunk()->mutable_data()));
        delete e;
      });
}

uint64_t ChunkBuffers::reused() {
  absl::MutexLock lock(&mu_);
  return reused_;
}

uint64_t ChunkBuffers::fresh() {
  absl::MutexLock lock(&mu_);
  return fresh_;
}

uint64_t ChunkBuffers::kept() {
  absl::MutexLock lock(&mu_);
  return faulted_.size() + released_.size();
}

uint64_t ChunkBuffers::kept_released() {
  absl::MutexLock lock(&mu_);
  return released_.size();
}

}  // namespace agentix::worker
