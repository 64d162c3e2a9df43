#include "worker/direct/chunk_buffers.h"

#include <utility>

#include "worker/ipc/chunking.h"

namespace agentix::worker {

std::shared_ptr<ChunkBuffers> ChunkBuffers::Create(size_t max_kept) {
  return std::shared_ptr<ChunkBuffers>(new ChunkBuffers(max_kept));
}

std::string ChunkBuffers::Take(size_t size) {
  std::string buffer;
  if (size <= ipc::kChunkBytes) {
    absl::MutexLock lock(&mu_);
    if (!kept_.empty()) {
      buffer = std::move(kept_.back());
      kept_.pop_back();
      ++reused_;
      return buffer;  // cleared by Give, capacity >= kChunkBytes
    }
    ++fresh_;
  } else {
    absl::MutexLock lock(&mu_);
    ++fresh_;
  }
  buffer.reserve(size);
  return buffer;
}

void ChunkBuffers::Give(std::string buffer) {
  if (buffer.capacity() < ipc::kChunkBytes) return;
  buffer.clear();
  absl::MutexLock lock(&mu_);
  if (kept_.size() < max_kept_) kept_.push_back(std::move(buffer));
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
  return kept_.size();
}

}  // namespace agentix::worker
