#include "worker/direct/chunk_buffers.h"

#include <catch2/catch.hpp>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/ipc/chunking.h"

namespace agentix::worker {
namespace {

// The whole pages in [data, data + size): their first byte and count.
std::pair<uintptr_t, size_t> WholePages(const char* data, size_t size) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin =
      (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + size) & ~(page - 1);
  return {begin, begin < end ? (end - begin) / page : 0};
}

// How many of the whole pages in [data, data + size) are resident.
size_t ResidentPages(const char* data, size_t size) {
  const auto [begin, count] = WholePages(data, size);
  if (count == 0) return 0;
  std::vector<unsigned char> pages(count);
  const size_t bytes = count * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  REQUIRE(mincore(reinterpret_cast<void*>(begin), bytes, pages.data()) == 0);
  size_t resident = 0;
  for (unsigned char p : pages) resident += p & 1;
  return resident;
}

TEST_CASE("a chunk event's buffer comes back when the event is destroyed and "
          "serves the next take",
          "[direct]") {
  std::shared_ptr<ChunkBuffers> buffers = ChunkBuffers::Create(2);
  std::string data = buffers->Take(ipc::kChunkBytes);
  CHECK(buffers->fresh() == 1);
  CHECK(data.empty());
  REQUIRE(data.capacity() >= ipc::kChunkBytes);
  data.assign(ipc::kChunkBytes, 'x');
  const char* const memory = data.data();

  auto event = buffers->ChunkEvent("c1", std::move(data));
  REQUIRE(event->has_result_chunk());
  CHECK(event->result_chunk().call_id() == "c1");
  CHECK(event->result_chunk().data() == std::string(ipc::kChunkBytes, 'x'));
  CHECK(event->result_chunk().data().data() == memory);  // moved, not copied
  CHECK(buffers->kept() == 0);

  event.reset();
  CHECK(buffers->kept() == 1);
  std::string again = buffers->Take(ipc::kChunkBytes);
  CHECK(buffers->reused() == 1);
  CHECK(buffers->fresh() == 1);
  CHECK(again.empty());
  CHECK(again.data() == memory);  // the same pages
  CHECK(buffers->kept() == 0);
}

TEST_CASE("chunk buffers keep at most their bound and no small or oversized "
          "takes",
          "[direct]") {
  std::shared_ptr<ChunkBuffers> buffers = ChunkBuffers::Create(2);
  std::string taken[3];
  for (std::string& b : taken) b = buffers->Take(ipc::kChunkBytes);
  CHECK(buffers->fresh() == 3);
  for (std::string& b : taken) {
    b.resize(ipc::kChunkBytes);
    buffers->Give(std::move(b));
  }
  CHECK(buffers->kept() == 2);  // the third was freed
  buffers->Give(std::string(100, 'y'));  // too small to be worth keeping
  CHECK(buffers->kept() == 2);

  // A take over a chunk is never served from the kept ones.
  const uint64_t reused = buffers->reused();
  std::string big = buffers->Take(ipc::kChunkBytes + 1);
  CHECK(big.capacity() >= ipc::kChunkBytes + 1);
  CHECK(buffers->reused() == reused);
  CHECK(buffers->kept() == 2);
}

TEST_CASE("a chunk event outliving its last other reference to the buffers "
          "keeps them alive",
          "[direct]") {
  std::shared_ptr<ChunkBuffers> buffers = ChunkBuffers::Create(1);
  std::weak_ptr<ChunkBuffers> weak = buffers;
  auto event =
      buffers->ChunkEvent("c2", std::string(ipc::kChunkBytes, 'z'));
  buffers.reset();
  CHECK_FALSE(weak.expired());
  event.reset();  // gives the buffer back, then the buffers go
  CHECK(weak.expired());
}

TEST_CASE("chunk buffers kept beyond max_faulted give their pages back, stay "
          "kept and serve later takes after the faulted ones",
          "[direct]") {
  std::shared_ptr<ChunkBuffers> buffers = ChunkBuffers::Create(3, 1);
  std::string taken[4];
  const char* memory[4];
  for (int i = 0; i < 4; ++i) {
    taken[i] = buffers->Take(ipc::kChunkBytes);
    taken[i].assign(ipc::kChunkBytes, 'x');
    memory[i] = taken[i].data();
  }
  CHECK(buffers->fresh() == 4);
  for (std::string& b : taken) buffers->Give(std::move(b));
  CHECK(buffers->kept() == 3);  // the fourth was freed
  CHECK(buffers->kept_released() == 2);

  // The one with its pages comes first, then the released ones; no fresh
  // allocation while any is kept.
  std::string again[3];
  for (std::string& b : again) b = buffers->Take(ipc::kChunkBytes);
  CHECK(again[0].data() == memory[0]);
  CHECK(again[1].data() == memory[2]);
  CHECK(again[2].data() == memory[1]);
  CHECK(buffers->fresh() == 4);
  CHECK(buffers->reused() == 3);
  CHECK(buffers->kept() == 0);
  for (std::string& b : again) {
    CHECK(b.empty());
    REQUIRE(b.capacity() >= ipc::kChunkBytes);
    b.assign(ipc::kChunkBytes, 'y');  // released pages are writable again
    CHECK(b == std::string(ipc::kChunkBytes, 'y'));
  }
}

TEST_CASE("a released chunk buffer is taken with the pages its take's size "
          "reaches faulted in at once, and no more",
          "[direct]") {
  // MADV_POPULATE_WRITE (Linux 5.14): one system call instead of a page
  // fault a page as the chunk is written.
  std::shared_ptr<ChunkBuffers> buffers = ChunkBuffers::Create(1, 0);
  std::string buffer = buffers->Take(ipc::kChunkBytes);
  buffer.assign(ipc::kChunkBytes, 'x');
  const char* const memory = buffer.data();
  buffers->Give(std::move(buffer));
  REQUIRE(buffers->kept_released() == 1);
  // Released: only the first page (the terminator) may still be there.
  CHECK(ResidentPages(memory, ipc::kChunkBytes) <= 1);

  const size_t half = ipc::kChunkBytes / 2;
  std::string again = buffers->Take(half);
  REQUIRE(again.data() == memory);
  CHECK(again.empty());
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  CHECK(ResidentPages(memory, half) == WholePages(memory, half).second);
  CHECK(ResidentPages(memory + half + page, ipc::kChunkBytes - half - page) ==
        0);
}

TEST_CASE("a fresh chunk buffer is taken with the pages its take's size "
          "reaches faulted in at once, and no more",
          "[direct]") {
  // A worker's first large results take fresh buffers: filled in one system
  // call, not a page fault a page as the chunk is written. The earlier
  // cases' buffers are free heap blocks now, which malloc hands out again
  // with their pages: malloc_trim gives those pages back first.
  malloc_trim(0);
  std::shared_ptr<ChunkBuffers> buffers = ChunkBuffers::Create(1);
  const size_t half = ipc::kChunkBytes / 2;
  std::string fresh = buffers->Take(half);
  REQUIRE(buffers->fresh() == 1);
  CHECK(fresh.empty());
  const char* const memory = fresh.data();
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  CHECK(ResidentPages(memory, half) == WholePages(memory, half).second);
  CHECK(ResidentPages(memory + half + page, ipc::kChunkBytes - half - page) ==
        0);
}

TEST_CASE("a fresh chunk buffer for a partial chunk can still be kept",
          "[direct]") {
  std::shared_ptr<ChunkBuffers> buffers = ChunkBuffers::Create(1);
  std::string part = buffers->Take(ipc::kChunkBytes - 5);
  CHECK(part.capacity() >= ipc::kChunkBytes);
  buffers->Give(std::move(part));
  CHECK(buffers->kept() == 1);
}

}  // namespace
}  // namespace agentix::worker
