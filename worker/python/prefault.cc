#include "worker/python/prefault.h"

#include <Python.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fresh_pages.h"

namespace agentix::worker {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
// CPython 3.11's obmalloc asks for 1 MiB arenas (ARENA_BITS 20 with the
// radix tree); other sizes go to its own allocator.
constexpr size_t kArenaBytes = kMiB;

struct ArenaReserve {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  std::mutex mu;
  uintptr_t next = 0;              // the next never-used slot
  std::vector<uintptr_t> freed;    // slots CPython gave back (still faulted in)
  PyObjectArenaAllocator fallback{};
  std::atomic<size_t> from_reserve{0};
  std::atomic<size_t> mapped{0};
};

ArenaReserve* g_reserve = nullptr;  // set once, never freed (the process's life)
std::atomic<size_t> g_pages_done{0};
std::atomic<size_t> g_library_pages{0};
std::atomic<bool> g_finished{false};
std::atomic<size_t> g_image_data_pages{0};

void* ArenaAlloc(void* ctx, size_t size) {
  auto* reserve = static_cast<ArenaReserve*>(ctx);
  if (size == kArenaBytes) {
    std::lock_guard<std::mutex> lock(reserve->mu);
    uintptr_t slot = 0;
    if (!reserve->freed.empty()) {
      slot = reserve->freed.back();
      reserve->freed.pop_back();
    } else if (reserve->next + kArenaBytes <= reserve->end) {
      slot = reserve->next;
      reserve->next += kArenaBytes;
    }
    if (slot != 0) {
      reserve->from_reserve.fetch_add(1, std::memory_order_relaxed);
      return reinterpret_cast<void*>(slot);
    }
  }
  reserve->mapped.fetch_add(1, std::memory_order_relaxed);
  return reserve->fallback.alloc(reserve->fallback.ctx, size);
}

void ArenaFree(void* ctx, void* ptr, size_t size) {
  auto* reserve = static_cast<ArenaReserve*>(ctx);
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  if (address >= reserve->begin && address < reserve->end) {
    // Kept for the next arena: its pages stay faulted in, and the reserve
    // never holds more than arena_mib.
    std::lock_guard<std::mutex> lock(reserve->mu);
    reserve->freed.push_back(address);
    return;
  }
  reserve->fallback.free(reserve->fallback.ctx, ptr, size);
}

// Faults [begin, end) in and reads one byte a page: on these VMs the first
// access after the fault costs as much again, and it is paid once per page
// whichever thread makes it. Reads only: the boot thread may already be
// writing to these pages.
// `populate`: anonymous memory, faulted in writable first (a read alone
// would map the zero page) by PopulateForWrite, which reads each page
// itself; file pages are only read.
void Touch(uintptr_t begin, uintptr_t end, bool populate) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (populate) {
    if (!base::PopulateForWrite(reinterpret_cast<void*>(begin), end - begin)) {
      return;  // an older kernel: a read would only map the zero page
    }
  } else {
    base::ReadEachPage(reinterpret_cast<const void*>(begin), end - begin);
  }
  g_pages_done.fetch_add((end - begin) / page, std::memory_order_relaxed);
}

struct Range {
  uintptr_t begin;
  uintptr_t end;
};

// The readable loadable segments' file-backed part of one loaded object,
// page-aligned.
void AddFileRanges(const dl_phdr_info& object, std::vector<Range>& ranges) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (int i = 0; i < object.dlpi_phnum; ++i) {
    const ElfW(Phdr)& header = object.dlpi_phdr[i];
    if (header.p_type != PT_LOAD || (header.p_flags & PF_R) == 0) continue;
    const uintptr_t begin = (object.dlpi_addr + header.p_vaddr) & ~(page - 1);
    const uintptr_t end =
        (object.dlpi_addr + header.p_vaddr + header.p_filesz) & ~(page - 1);
    if (end > begin) ranges.push_back({begin, end});
  }
}

bool HoldsAddress(const dl_phdr_info& object, uintptr_t address) {
  for (int i = 0; i < object.dlpi_phnum; ++i) {
    const ElfW(Phdr)& header = object.dlpi_phdr[i];
    const uintptr_t begin = object.dlpi_addr + header.p_vaddr;
    if (header.p_type == PT_LOAD && address >= begin &&
        address < begin + header.p_memsz) {
      return true;
    }
  }
  return false;
}

// The mapped file of libpython. Found by name first: the address of one of
// its functions can be the executable's PLT entry (a non-PIC executable's
// canonical address). With no shared libpython loaded (agentix-worker links
// it statically) it is the object holding the interpreter's code: the
// executable itself.
std::vector<Range> LibpythonRanges() {
  std::vector<Range> ranges;
  dl_iterate_phdr(
      [](dl_phdr_info* object, size_t, void* data) {
        const char* name = object->dlpi_name;
        const char* base = name == nullptr ? nullptr : strrchr(name, '/');
        base = base == nullptr ? name : base + 1;
        if (base == nullptr || strncmp(base, "libpython", 9) != 0) return 0;
        AddFileRanges(*object, *static_cast<std::vector<Range>*>(data));
        return 1;
      },
      &ranges);
  if (!ranges.empty()) return ranges;
  dl_iterate_phdr(
      [](dl_phdr_info* object, size_t, void* data) {
        const auto code = reinterpret_cast<uintptr_t>(&Py_InitializeFromConfig);
        if (!HoldsAddress(*object, code)) return 0;
        AddFileRanges(*object, *static_cast<std::vector<Range>*>(data));
        return 1;
      },
      &ranges);
  return ranges;
}

// The executable's writable loadable segments, page-aligned, less the part
// that is read-only after relocation (PT_GNU_RELRO: populating it for
// writing would fail, and the loader wrote it already).
std::vector<Range> ImageDataRanges() {
  std::vector<Range> ranges;
  dl_iterate_phdr(
      [](dl_phdr_info* object, size_t, void* data) {
        // The executable comes first and has an empty name.
        if (object->dlpi_name != nullptr && object->dlpi_name[0] != '\0') return 1;
        const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
        uintptr_t relro_end = 0;
        for (int i = 0; i < object->dlpi_phnum; ++i) {
          const ElfW(Phdr)& header = object->dlpi_phdr[i];
          if (header.p_type == PT_GNU_RELRO) {
            relro_end = (object->dlpi_addr + header.p_vaddr + header.p_memsz) & ~(page - 1);
          }
        }
        auto& out = *static_cast<std::vector<Range>*>(data);
        for (int i = 0; i < object->dlpi_phnum; ++i) {
          const ElfW(Phdr)& header = object->dlpi_phdr[i];
          if (header.p_type != PT_LOAD || (header.p_flags & PF_W) == 0) continue;
          const uintptr_t begin = std::max(
              (object->dlpi_addr + header.p_vaddr) & ~(page - 1), relro_end);
          const uintptr_t end =
              (object->dlpi_addr + header.p_vaddr + header.p_memsz + page - 1) & ~(page - 1);
          if (end > begin) out.push_back({begin, end});
        }
        return 1;
      },
      &ranges);
  return ranges;
}

}  // namespace

absl::Status StartPrefault(const PrefaultOptions& options) {
  if (g_reserve != nullptr) {
    return absl::FailedPreconditionError("StartPrefault called twice");
  }
  if (options.image_data) {
    // On this thread: the boot's first steps write these pages. A kernel
    // without MADV_POPULATE_WRITE leaves them to those writes. The populate
    // alone, without PopulateForWrite's read of each page: the boot writes
    // ~310 of the executable's ~400, and a read would add the hypervisor's
    // trip for the others to the boot.
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    for (const Range& range : ImageDataRanges()) {
      if (base::PopulateCoveringForWrite(reinterpret_cast<void*>(range.begin),
                                         range.end - range.begin)) {
        g_image_data_pages += (range.end - range.begin) / page;
      }
    }
  }
  uintptr_t arenas_begin = 0;
  uintptr_t arenas_end = 0;
  if (options.arena_mib > 0) {
    // Aligned to the arena size: obmalloc loses a pool per unaligned arena.
    const size_t bytes = options.arena_mib * kMiB;
    void* mapped = mmap(nullptr, bytes + kArenaBytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapped == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot reserve ", options.arena_mib,
                       " MiB for the interpreter's arenas"));
    }
    const auto raw = reinterpret_cast<uintptr_t>(mapped);
    arenas_begin = (raw + kArenaBytes - 1) & ~(kArenaBytes - 1);
    arenas_end = arenas_begin + bytes;
    if (arenas_begin > raw) munmap(mapped, arenas_begin - raw);
    const uintptr_t tail = raw + bytes + kArenaBytes;
    if (tail > arenas_end) {
      munmap(reinterpret_cast<void*>(arenas_end), tail - arenas_end);
    }
  }
  auto* reserve = new ArenaReserve;
  reserve->begin = arenas_begin;
  reserve->end = arenas_end;
  reserve->next = arenas_begin;
  g_reserve = reserve;
  if (arenas_begin != 0) {
    PyObject_GetArenaAllocator(&reserve->fallback);
    PyObjectArenaAllocator ours{reserve, ArenaAlloc, ArenaFree};
    PyObject_SetArenaAllocator(&ours);
  }

  // The heap's top: allocated and freed once, so it stays mapped (the
  // worker's M_TRIM_THRESHOLD, base/malloc_tuning, is far above it). Only
  // when that tuning applies and the block came from the brk heap: a top
  // that malloc could trim, or an mmap'd block, would be unmapped under the
  // thread.
  uintptr_t heap_begin = 0;
  uintptr_t heap_end = 0;
  if (options.heap_mib > 0 && getenv("GLIBC_TUNABLES") == nullptr) {
    const size_t bytes = options.heap_mib * kMiB;
    void* block = malloc(bytes);
    const auto address = reinterpret_cast<uintptr_t>(block);
    free(block);
    const auto brk_end = reinterpret_cast<uintptr_t>(sbrk(0));
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    if (block != nullptr && address + bytes <= brk_end) {
      heap_begin = (address + page - 1) & ~(page - 1);
      heap_end = (address + bytes) & ~(page - 1);
    }
  }
  std::vector<Range> library;
  if (options.libpython) library = LibpythonRanges();
  if (arenas_begin == 0 && heap_begin == 0 && library.empty()) {
    g_finished.store(true);
    return absl::OkStatus();
  }
  std::thread([arenas_begin, arenas_end, heap_begin, heap_end,
               library = std::move(library)] {
    pthread_setname_np(pthread_self(), "agx-prefault");
    // In the order a booting interpreter needs them: an arena, a MiB of
    // the heap, a MiB of libpython, and so on.
    uintptr_t arena = arenas_begin;
    uintptr_t heap = heap_begin;
    size_t segment = 0;
    uintptr_t at = library.empty() ? 0 : library[0].begin;
    while (arena < arenas_end || heap < heap_end || segment < library.size()) {
      if (arena < arenas_end) {
        Touch(arena, arena + kArenaBytes, true);
        arena += kArenaBytes;
      }
      if (heap < heap_end) {
        const uintptr_t next = std::min(heap + kMiB, heap_end);
        Touch(heap, next, true);
        heap = next;
      }
      if (segment < library.size()) {
        const uintptr_t next = std::min(at + kMiB, library[segment].end);
        Touch(at, next, false);
        g_library_pages.fetch_add((next - at) / static_cast<size_t>(sysconf(_SC_PAGESIZE)),
                                  std::memory_order_relaxed);
        at = next;
        if (at >= library[segment].end && ++segment < library.size()) {
          at = library[segment].begin;
        }
      }
    }
    g_finished.store(true);
  }).detach();
  return absl::OkStatus();
}

PrefaultState GetPrefaultState() {
  PrefaultState state;
  if (g_reserve != nullptr) {
    state.reserve_begin = g_reserve->begin;
    state.reserve_end = g_reserve->end;
    state.arenas_from_reserve = g_reserve->from_reserve.load();
    state.arenas_mapped = g_reserve->mapped.load();
  }
  state.pages_done = g_pages_done.load();
  state.library_pages = g_library_pages.load();
  state.image_data_pages = g_image_data_pages.load();
  state.finished = g_finished.load();
  return state;
}

}  // namespace agentix::worker
