#include "worker/ipc/chunking.h"

#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace agentix::ipc {
namespace {

constexpr size_t k = kChunkBytes;

TEST_CASE("a result is cut into full chunks and a non-empty tail") {
  struct Case {
    size_t size, full, last;
  };
  const Case cases[] = {{0, 0, 0},         {1, 0, 1},
                        {k - 1, 0, k - 1}, {k, 0, k},
                        {k + 1, 1, 1},     {2 * k, 1, k},
                        {2 * k + 7, 2, 7}, {5 * k, 4, k}};
  for (const Case& c : cases) {
    CAPTURE(c.size);
    const TailSplit split = SplitWithTail(c.size);
    CHECK(split.full == c.full);
    CHECK(split.last == c.last);
    CHECK(split.full * k + split.last == c.size);
  }
}

TEST_CASE("ForEachChunk covers the bytes in order in kChunkBytes pieces") {
  for (size_t size : {size_t{0}, size_t{1}, k, k + 1, 3 * k - 1}) {
    CAPTURE(size);
    std::string bytes(size, '\0');
    for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 7);
    std::vector<size_t> sizes;
    std::string joined;
    ForEachChunk(bytes, [&](std::string_view piece) {
      sizes.push_back(piece.size());
      joined.append(piece);
    });
    CHECK(joined == bytes);
    CHECK(sizes.size() == (size + k - 1) / k);
    for (size_t i = 0; i + 1 < sizes.size(); ++i) CHECK(sizes[i] == k);
    if (!sizes.empty()) CHECK(sizes.back() >= 1);
  }
}

}  // namespace
}  // namespace agentix::ipc
