#include "worker/direct/chunk_buffers.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

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

}  // namespace

std::shared_ptr<ChunkBuffers> ChunkBuffers::Create(size_t max_kept,
                                                   size_t max_faulted) {
  return std::shared_ptr<ChunkBuffers>(
      new ChunkBuffers(max_kept, std::min(max_kept, max_faulted)));
}

std::string ChunkBuffers::Take(size_t size) {
  std::string buffer;
  {
    absl::MutexLock lock(&mu_);
    if (size <= ipc::kChunkBytes) {
      for (std::vector<std::string>* kept : {&faulted_, &released_}) {
        if (kept->empty()) continue;
        buffer = std::move(kept->back());
        kept->pop_back();
        ++reused_;
        return buffer;  // cleared by Give, capacity >= kChunkBytes
      }
    }
    ++fresh_;
  }
  buffer.reserve(std::max(size, ipc::kChunkBytes));
  return buffer;
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
