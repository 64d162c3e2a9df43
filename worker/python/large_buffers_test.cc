#include "worker/python/large_buffers.h"

#include <Python.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "worker/python/test_interpreter.h"

namespace agentix::worker {
namespace {

using testing::EnsureInterpreter;
using testing::EvalPython;
using testing::RunPython;

constexpr size_t kMiB = size_t{1} << 20;

std::unique_ptr<LargeBufferPool> MakePool(const LargeBufferOptions& options) {
  absl::StatusOr<LargeBufferPool*> pool = LargeBufferPool::Create(options);
  INFO(pool.status().ToString());
  REQUIRE(pool.ok());
  return std::unique_ptr<LargeBufferPool>(*pool);
}

TEST_CASE("LargeBufferPool rejects options it cannot serve") {
  CHECK(LargeBufferPool::Create({.slots = 0}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(LargeBufferPool::Create({.threshold_bytes = 8 * kMiB, .slot_bytes = 4 * kMiB})
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("LargeBufferPool serves only sizes in [threshold, slot_bytes]") {
  auto pool = MakePool({.threshold_bytes = kMiB, .slot_bytes = 4 * kMiB, .slots = 2});
  CHECK(pool->Allocate(kMiB - 1, false) == nullptr);
  CHECK(pool->Allocate(4 * kMiB + 1, false) == nullptr);
  void* a = pool->Allocate(kMiB, false);
  void* b = pool->Allocate(4 * kMiB, false);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  CHECK(a != b);
  CHECK(pool->Owns(a));
  CHECK(pool->Owns(static_cast<char*>(b) + 4 * kMiB - 1));
  int on_stack = 0;
  CHECK_FALSE(pool->Owns(&on_stack));
  CHECK_FALSE(pool->Owns(nullptr));
  // Every slot in use: the caller falls back to malloc.
  CHECK(pool->Allocate(2 * kMiB, false) == nullptr);
  CHECK(pool->state().in_use == 2);
  pool->Free(a);
  pool->Free(b);
  CHECK(pool->state().in_use == 0);
}

TEST_CASE("LargeBufferPool hands a freed slot out again with its pages kept") {
  auto pool = MakePool({.threshold_bytes = kMiB, .slot_bytes = 8 * kMiB, .slots = 3});
  auto* first = static_cast<char*>(pool->Allocate(6 * kMiB, false));
  REQUIRE(first != nullptr);
  std::memset(first, 0x5a, 6 * kMiB);
  pool->Free(first);
  CHECK(pool->state().idle_faulted == 6 * kMiB);
  auto* again = static_cast<char*>(pool->Allocate(6 * kMiB, false));
  CHECK(again == first);
  CHECK(again[6 * kMiB - 1] == 0x5a);  // not given back: the same pages
  CHECK(pool->state().idle_faulted == 0);
  CHECK(pool->state().released == 0);
  pool->Free(again);
}

TEST_CASE("LargeBufferPool gives back idle pages beyond keep_idle_bytes, oldest first") {
  auto pool = MakePool({.threshold_bytes = kMiB,
                        .slot_bytes = 4 * kMiB,
                        .slots = 3,
                        .keep_idle_bytes = 5 * kMiB});
  auto* a = static_cast<char*>(pool->Allocate(4 * kMiB, false));
  auto* b = static_cast<char*>(pool->Allocate(4 * kMiB, false));
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  std::memset(a, 1, 4 * kMiB);
  std::memset(b, 2, 4 * kMiB);
  pool->Free(a);
  CHECK(pool->state().idle_faulted == 4 * kMiB);
  pool->Free(b);  // 8 MiB idle > 5: a, the longer idle, goes
  CHECK(pool->state().idle_faulted == 4 * kMiB);
  CHECK(pool->state().released == 1);
  CHECK(a[0] == 0);  // given back: reads as a fresh page
  CHECK(b[0] == 2);
  // The slot with pages is preferred; calloc's zeroing covers its old bytes.
  auto* c = static_cast<char*>(pool->Allocate(3 * kMiB, true));
  CHECK(c == b);
  CHECK(c[0] == 0);
  CHECK(c[3 * kMiB - 1] == 0);
  pool->Free(c);
}

TEST_CASE("LargeBufferPool resizes in place within its range only") {
  auto pool = MakePool({.threshold_bytes = kMiB, .slot_bytes = 4 * kMiB, .slots = 1});
  void* a = pool->Allocate(4 * kMiB, false);
  REQUIRE(a != nullptr);
  CHECK(pool->ResizeInPlace(a, 2 * kMiB) == a);
  CHECK(pool->SizeOf(a) == 2 * kMiB);
  CHECK(pool->ResizeInPlace(a, kMiB - 1) == nullptr);
  CHECK(pool->ResizeInPlace(a, 4 * kMiB + 1) == nullptr);
  pool->Free(a);
}

TEST_CASE("LargeBufferPool never hands one slot to two threads at once") {
  auto pool = MakePool({.threshold_bytes = kMiB,
                        .slot_bytes = 2 * kMiB,
                        .slots = 3,
                        .keep_idle_bytes = 2 * kMiB});
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::vector<int> overwritten(kThreads, 0);
  std::vector<int> served(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        auto* p = static_cast<unsigned char*>(pool->Allocate(kMiB + 4096, false));
        if (p == nullptr) continue;  // all in use: malloc's turn
        ++served[t];
        const unsigned char mark = static_cast<unsigned char>(t * 50 + i % 50 + 1);
        p[0] = mark;
        p[kMiB] = mark;
        std::this_thread::yield();
        if (p[0] != mark || p[kMiB] != mark) ++overwritten[t];
        pool->Free(p);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  int total = 0;
  for (int t = 0; t < kThreads; ++t) {
    CHECK(overwritten[t] == 0);
    total += served[t];
  }
  CHECK(total > 0);
  CHECK(pool->state().in_use == 0);
  CHECK(pool->state().idle_faulted <= 2 * kMiB);
}

TEST_CASE("the default pool holds a 64 MiB bytes object and keeps its pages "
          "when it is freed") {
  auto pool = MakePool({});
  // What PyBytes_FromStringAndSize asks for 64 MiB: the header, the bytes
  // and their NUL; an upload's buffer adds its encoding's few bytes.
  const size_t value = offsetof(PyBytesObject, ob_sval) + (64 * kMiB) + 1;
  void* first = pool->Allocate(value + 64, /*zeroed=*/false);
  REQUIRE(first != nullptr);
  std::memset(first, 1, value + 64);
  pool->Free(first);
  CHECK(pool->state().idle_faulted >= value + 64);  // not given back
  // The next 64 MiB value reuses the same, faulted-in slot.
  void* second = pool->Allocate(value, /*zeroed=*/false);
  CHECK(second == first);
  CHECK(static_cast<unsigned char*>(second)[value - 1] == 1);
  pool->Free(second);
}

// The pool behind CPython's raw allocator: installed before the interpreter
// starts (this binary's first case; Catch2 runs them in order).
void InstallOnce() {
  static const bool installed = [] {
    const absl::Status status = InstallLargeBufferPool(
        {.threshold_bytes = kMiB, .slot_bytes = 8 * kMiB, .slots = 2,
         .keep_idle_bytes = 8 * kMiB});
    INFO(status.ToString());
    REQUIRE(status.ok());
    return true;
  }();
  (void)installed;
  EnsureInterpreter();
}

TEST_CASE("the interpreter's large bytes come from the installed pool and go back") {
  InstallOnce();
  LargeBufferPool* pool = InstalledLargeBufferPool();
  REQUIRE(pool != nullptr);
  const size_t before = pool->state().allocations;
  PyObject* value = EvalPython("bytes(range(256)) * (6 * 4096)");  // 6 MiB
  REQUIRE(value != nullptr);
  CHECK(pool->Owns(value));
  CHECK(pool->state().in_use == 1);
  CHECK(pool->state().allocations == before + 1);
  Py_DECREF(value);
  CHECK(pool->state().in_use == 0);
  // Small and oversized objects stay with CPython's own allocators.
  PyObject* small = EvalPython("b'x' * 4096");
  PyObject* huge = EvalPython("b'y' * (9 * 1024 * 1024)");
  REQUIRE(small != nullptr);
  REQUIRE(huge != nullptr);
  CHECK_FALSE(pool->Owns(small));
  CHECK_FALSE(pool->Owns(huge));
  Py_DECREF(small);
  Py_DECREF(huge);
}

TEST_CASE("bytes shrunk and grown across the threshold keep their contents") {
  InstallOnce();
  // bytearray resizes through realloc: into the pool, within it, out of it.
  RunPython(
      "b = bytearray(b'abc')\n"
      "b.extend(bytes(range(256)) * 8192)\n"   // 2 MiB: malloc's realloc
      "big = bytearray(3 * 1024 * 1024)\n"     // from the pool
      "big[:3] = b'xyz'\n"
      "big[-1] = 7\n"
      "del big[4 * 1024 * 1024 // 2:]\n"       // shrinks within the pool
      "assert big[:3] == b'xyz' and len(big) == 2 * 1024 * 1024\n"
      "del big[4096:]\n"                        // out of the pool
      "assert big[:3] == b'xyz' and len(big) == 4096\n"
      "z = bytearray(5 * 1024 * 1024)\n"        // zeroed, from a used slot
      "assert z.count(0) == len(z)\n"
      "import pickle\n"
      "v = pickle.loads(pickle.dumps(bytes(range(256)) * 16384, protocol=5))\n"
      "assert v == bytes(range(256)) * 16384\n"
      "del b, big, z, v\n");
  CHECK(InstalledLargeBufferPool()->state().in_use == 0);
}

TEST_CASE("threads allocating large bytes without the GIL's order stay correct") {
  InstallOnce();
  RunPython(
      "import threading\n"
      "errors = []\n"
      "def work(k):\n"
      "    for i in range(30):\n"
      "        v = bytes([k]) * (2 * 1024 * 1024 + i)\n"
      "        w = v[:-1] + b'!'\n"
      "        if w[0] != k or w[-1] != 33 or len(w) != len(v):\n"
      "            errors.append(k)\n"
      "ts = [threading.Thread(target=work, args=(k,)) for k in range(1, 5)]\n"
      "[t.start() for t in ts]\n"
      "[t.join() for t in ts]\n"
      "assert not errors, errors\n");
  CHECK(InstalledLargeBufferPool()->state().in_use == 0);
}

}  // namespace
}  // namespace agentix::worker
