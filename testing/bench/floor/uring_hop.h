// A hand-off in one kernel entry, for the floor programs: write a message to
// one descriptor and sleep until another is readable (or read it) in a
// single io_uring_enter, raw syscalls (no liburing). The question it answers
// (docs/PERFORMANCE.md "stop-28"): on one CPU, does a waker that sleeps in
// the same syscall as its wake-up avoid being preempted by its wakee, and
// so leave one runnable thread instead of two?
#ifndef AGENTIX_TESTING_BENCH_FLOOR_URING_HOP_H_
#define AGENTIX_TESTING_BENCH_FLOOR_URING_HOP_H_

#include <errno.h>
#include <linux/io_uring.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#ifndef IORING_SETUP_NO_SQARRAY
#define IORING_SETUP_NO_SQARRAY (1U << 16)  // 6.6; older headers lack it
#endif

namespace agentix::bench {

class UringHop {
 public:
  UringHop() = default;
  UringHop(const UringHop&) = delete;
  UringHop& operator=(const UringHop&) = delete;
  ~UringHop() {
    if (sq_ring_ != MAP_FAILED) ::munmap(sq_ring_, sq_ring_bytes_);
    if (cq_ring_ != MAP_FAILED && cq_ring_ != sq_ring_) ::munmap(cq_ring_, cq_ring_bytes_);
    if (sqes_ != MAP_FAILED) ::munmap(sqes_, sqes_bytes_);
    if (fd_ >= 0) ::close(fd_);
  }

  // 0, or the errno that refused the ring (ENOSYS, EPERM: seccomp or
  // kernel.io_uring_disabled). `defer`: SINGLE_ISSUER | DEFER_TASKRUN (the
  // completion work runs when this thread waits, not at the waker's wake-up).
  int Open(bool defer) {
    io_uring_params p{};
    const unsigned base = defer ? (IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN) : 0;
    // Without the SQ index array where the kernel allows it (one store less
    // per entry); a kernel before 6.6 refuses the flag with EINVAL.
    p.flags = base | IORING_SETUP_NO_SQARRAY;
    fd_ = static_cast<int>(::syscall(__NR_io_uring_setup, 8, &p));
    if (fd_ < 0 && errno == EINVAL) {
      p = io_uring_params{};
      p.flags = base;
      fd_ = static_cast<int>(::syscall(__NR_io_uring_setup, 8, &p));
    }
    if (fd_ < 0) return errno;
    const bool no_array = (p.flags & IORING_SETUP_NO_SQARRAY) != 0;
    sq_ring_bytes_ = no_array ? p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe)
                              : p.sq_off.array + p.sq_entries * sizeof(uint32_t);
    cq_ring_bytes_ = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
    const bool single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single) sq_ring_bytes_ = cq_ring_bytes_ = std::max(sq_ring_bytes_, cq_ring_bytes_);
    sq_ring_ = ::mmap(nullptr, sq_ring_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                      fd_, IORING_OFF_SQ_RING);
    if (sq_ring_ == MAP_FAILED) return errno;
    cq_ring_ = single ? sq_ring_
                      : ::mmap(nullptr, cq_ring_bytes_, PROT_READ | PROT_WRITE,
                               MAP_SHARED | MAP_POPULATE, fd_, IORING_OFF_CQ_RING);
    if (cq_ring_ == MAP_FAILED) return errno;
    sqes_bytes_ = p.sq_entries * sizeof(io_uring_sqe);
    sqes_ = ::mmap(nullptr, sqes_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_,
                   IORING_OFF_SQES);
    if (sqes_ == MAP_FAILED) return errno;
    char* sq = static_cast<char*>(sq_ring_);
    char* cq = static_cast<char*>(cq_ring_);
    sq_tail_ = reinterpret_cast<std::atomic<uint32_t>*>(sq + p.sq_off.tail);
    sq_mask_ = *reinterpret_cast<uint32_t*>(sq + p.sq_off.ring_mask);
    sq_array_ = no_array ? nullptr : reinterpret_cast<uint32_t*>(sq + p.sq_off.array);
    cq_head_ = reinterpret_cast<std::atomic<uint32_t>*>(cq + p.cq_off.head);
    cq_tail_ = reinterpret_cast<std::atomic<uint32_t>*>(cq + p.cq_off.tail);
    cq_mask_ = *reinterpret_cast<uint32_t*>(cq + p.cq_off.ring_mask);
    cqes_ = reinterpret_cast<io_uring_cqe*>(cq + p.cq_off.cqes);
    // The ring's fd registered with itself: io_uring_enter then skips the
    // fd table lookup (5.18; without it, the plain fd).
    io_uring_rsrc_update update{};
    update.offset = static_cast<uint32_t>(-1);
    update.data = static_cast<uint64_t>(fd_);
    if (::syscall(__NR_io_uring_register, fd_, IORING_REGISTER_RING_FDS, &update, 1) == 1) {
      enter_fd_ = static_cast<int>(update.offset);
      enter_flags_ = IORING_ENTER_REGISTERED_RING;
    } else {
      enter_fd_ = fd_;
    }
    return 0;
  }

  // Writes `n` bytes of `data` to `out`, then sleeps until `in` is readable
  // (POLL_ADD; the caller reads) or, with `read_into`, reads up to
  // `read_bytes` into it: one io_uring_enter. Returns the wait's result
  // (poll: the revents; read: the bytes read) or -errno; a failed write
  // returns -EIO (and leaves the wait armed), a short one is not noticed
  // (the floor programs write one byte).
  int WriteThenWait(int out, const void* data, size_t n, int in, void* read_into = nullptr,
                    size_t read_bytes = 0) {
    io_uring_sqe* w = Next();
    w->opcode = IORING_OP_WRITE;
    w->fd = out;
    w->addr = reinterpret_cast<uint64_t>(data);
    w->len = static_cast<uint32_t>(n);
    w->off = static_cast<uint64_t>(-1);
    w->user_data = kWrite;
    w->flags = IOSQE_CQE_SKIP_SUCCESS;  // only a failed write posts
    io_uring_sqe* r = Next();
    if (read_into == nullptr) {
      r->opcode = IORING_OP_POLL_ADD;
      r->fd = in;
      r->poll32_events = POLLIN;
    } else {
      r->opcode = IORING_OP_READ;
      r->fd = in;
      r->addr = reinterpret_cast<uint64_t>(read_into);
      r->len = static_cast<uint32_t>(read_bytes);
      r->off = static_cast<uint64_t>(-1);
    }
    r->user_data = kWait;
    sq_tail_->store(tail_, std::memory_order_release);
    unsigned to_submit = 2;
    for (;;) {
      const long rc = ::syscall(__NR_io_uring_enter, enter_fd_, to_submit, 1u,
                                IORING_ENTER_GETEVENTS | enter_flags_, nullptr, 0);
      if (rc < 0) {
        if (errno == EINTR) continue;
        return -errno;
      }
      to_submit -= static_cast<unsigned>(rc) < to_submit ? static_cast<unsigned>(rc) : to_submit;
      uint32_t head = cq_head_->load(std::memory_order_relaxed);
      const uint32_t tail = cq_tail_->load(std::memory_order_acquire);
      if (head == tail) continue;
      const io_uring_cqe& c = cqes_[head & cq_mask_];
      // A write's completion is a failure: the wait is
      // then still armed and the ring of no further use to a floor program.
      const int result = c.user_data == kWrite ? -EIO : c.res;
      cq_head_->store(head + 1, std::memory_order_release);
      return result;
    }
  }

 private:
  static constexpr uint64_t kWrite = 1, kWait = 2;

  io_uring_sqe* Next() {
    const uint32_t index = tail_ & sq_mask_;
    io_uring_sqe* sqe = static_cast<io_uring_sqe*>(sqes_) + index;
    std::memset(sqe, 0, sizeof(*sqe));
    if (sq_array_ != nullptr) sq_array_[index] = index;
    ++tail_;
    return sqe;
  }

  int fd_ = -1;
  int enter_fd_ = -1;
  unsigned enter_flags_ = 0;
  void* sq_ring_ = MAP_FAILED;
  void* cq_ring_ = MAP_FAILED;
  void* sqes_ = MAP_FAILED;
  size_t sq_ring_bytes_ = 0, cq_ring_bytes_ = 0, sqes_bytes_ = 0;
  std::atomic<uint32_t>* sq_tail_ = nullptr;
  uint32_t sq_mask_ = 0;
  uint32_t* sq_array_ = nullptr;
  std::atomic<uint32_t>* cq_head_ = nullptr;
  std::atomic<uint32_t>* cq_tail_ = nullptr;
  uint32_t cq_mask_ = 0;
  io_uring_cqe* cqes_ = nullptr;
  uint32_t tail_ = 0;
};

}  // namespace agentix::bench

#endif  // AGENTIX_TESTING_BENCH_FLOOR_URING_HOP_H_
