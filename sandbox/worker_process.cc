#include "sandbox/worker_process.h"

#include <fcntl.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "base/log.h"
#include "base/payload_copy.h"
#include "base/string_resize.h"
#include "worker/ipc/descriptors.h"
#include "worker/ipc/io.h"

namespace agentix::sandbox {
namespace {


// Frames queued for one write are joined up to this size, so many small
// frames cost one syscall.
constexpr size_t kCoalesceBytes = 256 * 1024;

// Writes as much of `batch` (WorkerProcess::Outbound entries) as the socket
// takes without blocking; leaves the unwritten rest in `batch`. An entry
// with descriptors is left to the writer thread (SendWithDescriptors).
// Returns false if the channel is broken.
template <typename Queue>
bool TryWriteNow(int fd, Queue& batch) {
  while (!batch.empty()) {
    if (!batch.front().fds.empty()) return true;
    std::string& bytes = batch.front().bytes;
    ssize_t n = ::send(fd, bytes.data(), bytes.size(),
                       MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    if (static_cast<size_t>(n) < bytes.size()) {
      bytes.erase(0, static_cast<size_t>(n));
      return true;  // the socket is full: leave the rest to the writer
    }
    batch.pop_front();
  }
  return true;
}

// Writes queued frames, joining small neighbours into one syscall; a frame
// with descriptors goes alone, with them on its first byte.
template <typename Queue>
bool WriteBatch(int fd, const Queue& batch) {
  std::string joined;
  for (const auto& entry : batch) {
    const std::string& bytes = entry.bytes;
    if (entry.fds.empty() && bytes.size() < kCoalesceBytes &&
        joined.size() < kCoalesceBytes) {
      joined += bytes;
      continue;
    }
    if (!joined.empty() && !ipc::WriteAll(fd, joined).ok()) return false;
    joined.clear();
    if (!entry.fds.empty()) {
      std::vector<int> fds;
      for (const base::UniqueFd& owned : entry.fds) fds.push_back(owned.get());
      if (!ipc::SendWithDescriptors(fd, bytes, fds).ok()) return false;
      continue;
    }
    if (!ipc::WriteAll(fd, bytes).ok()) return false;
  }
  return joined.empty() || ipc::WriteAll(fd, joined).ok();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ipc::PayloadArea>> CreateWorkerArea(
    const WorkerOptions& options) {
  const uint32_t slots = options.ledger_call_slots;
  AGX_ASSIGN_OR_RETURN(
      std::unique_ptr<ipc::PayloadArea> area,
      ipc::PayloadArea::Create(
          options.payload_ring_bytes, /*sealed=*/false,
          slots == 0 ? 0 : ipc::LedgerBytes(slots, kLedgerFinishedSlots)));
  // Before the spawn: the worker opens the ledger as it boots. The memfd
  // is fresh: only the header is written.
  if (slots != 0) {
    AGX_RETURN_IF_ERROR(ipc::FormatLedger(area->Ledger(), slots, kLedgerFinishedSlots,
                                          /*region_is_zero=*/true));
  }
  return area;
}

uint32_t LedgerCallSlots(size_t max_retained_results) {
  return static_cast<uint32_t>(std::clamp<size_t>(
      max_retained_results, 4096, ipc::kLedgerMaxCallSlots));
}

std::string NewWorkerId() {
  std::random_device rd;
  return fmt::format("{:08x}", rd());
}

WorkerProcess::WorkerProcess(uint64_t generation, Listener* listener)
    : generation_(generation), listener_(listener) {}

WorkerProcess::WorkerProcess(const WorkerOptions& options, uint64_t generation,
                             Listener* listener, std::string worker_id)
    : generation_(generation), listener_(listener) {
  worker_id_ = std::move(worker_id);
  ready_timeout_ = options.ready_timeout;
  read_spin_ = options.read_spin;
  calls_cpu_ = options.calls_cpu;
  direct_listener_ = options.direct_listener;
}

WorkerCommand BuildWorkerCommand(const WorkerOptions& options,
                                 const std::string& worker_id, bool payload_fd) {
  WorkerCommand command;
  command.argv = {options.worker_path,
                  absl::StrCat("--channel-fd=", ipc::kWorkerChannelFd),
                  absl::StrCat("--worker-id=", worker_id)};
  if (!options.venv.empty()) {
    command.argv.push_back(absl::StrCat("--venv=", options.venv));
  }
  if (!options.python_path.empty()) {
    command.argv.push_back(absl::StrCat("--python-path=", options.python_path));
  }
  for (const auto& a : options.extra_args) command.argv.push_back(a);
  if (payload_fd) {
    command.argv.push_back(absl::StrCat("--payload-fd=", ipc::kWorkerPayloadFd));
  }
  command.env = options.env;
  command.env.push_back(absl::StrCat("AGENTIX_WORKER_ID=", worker_id));
  return command;
}

absl::StatusOr<SpawnedWorker> SpawnWorker(const WorkerOptions& options,
                                          const std::string& worker_id,
                                          const ipc::PayloadArea* payloads,
                                          SpawnThread thread) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("socketpair: ", strerror(errno)));
  }
  base::UniqueFd parent_end(fds[0]);
  base::UniqueFd child_end(fds[1]);
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("pipe: ", strerror(errno)));
  }
  base::UniqueFd err_read(err_pipe[0]);
  base::UniqueFd err_write(err_pipe[1]);
  // The worker gets exactly these fds (the spawn closes all others): the
  // spawner's stdin is not the worker's to read.
  base::UniqueFd null_in(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!null_in.valid()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("open /dev/null: ", strerror(errno)));
  }
  WorkerCommand command = BuildWorkerCommand(options, worker_id, payloads != nullptr);
  base::SpawnOptions spawn;
  spawn.path = options.worker_path;
  spawn.argv = std::move(command.argv);
  spawn.env = std::move(command.env);
  spawn.fd_map = {{null_in.get(), 0},
                  {child_end.get(), ipc::kWorkerChannelFd},
                  {err_write.get(), 2}};
  if (payloads != nullptr) {
    spawn.fd_map.push_back({payloads->fd(), ipc::kWorkerPayloadFd});
  }
  absl::StatusOr<base::ChildProcess> child =
      thread == SpawnThread::kLauncher
          ? base::ChildProcess::SpawnFromLauncherThread(spawn)
          : base::ChildProcess::Spawn(spawn);
  if (!child.ok()) return child.status();
  // Only the worker holds its ends now: EOF on the pipe and the channel
  // once it (and whoever inherited them) exits.
  return SpawnedWorker{*std::move(child), std::move(parent_end), std::move(err_read)};
}

absl::StatusOr<std::unique_ptr<WorkerProcess>> WorkerProcess::Start(
    const WorkerOptions& options, uint64_t generation, Listener* listener) {
  std::unique_ptr<WorkerProcess> worker(
      new WorkerProcess(options, generation, listener, NewWorkerId()));
  if (options.payload_ring_bytes > 0) {
    auto area = CreateWorkerArea(options);
    if (area.ok()) {
      worker->payloads_ = std::move(*area);
      worker->ledger_call_slots_ = options.ledger_call_slots;
    } else {
      // Not fatal: payloads then all take the socketpair.
      AGX_LOG(Warning, "no payload area for worker {}: {}", worker->worker_id_,
              area.status().ToString());
    }
  }
  absl::StatusOr<SpawnedWorker> spawned = SpawnWorker(
      options, worker->worker_id_, worker->payloads_.get(), SpawnThread::kLauncher);
  if (!spawned.ok()) return spawned.status();
  if (worker->payloads_) worker->payloads_->CloseFd();  // the mapping stays
  worker->Run(std::move(spawned->child), std::move(spawned->channel),
              std::move(spawned->stderr_read));
  AGX_LOG(Debug, "worker {} (generation {}) started as pid {}",
          worker->worker_id_, generation, worker->pid_);
  return worker;
}

namespace {

// The NUL-separated strings of /proc/PID/{cmdline,environ}.
absl::StatusOr<std::vector<std::string>> ReadProcStrings(pid_t pid,
                                                         const char* file) {
  const std::string path = absl::StrCat("/proc/", pid, "/", file);
  base::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    return absl::InvalidArgumentError(
        absl::StrCat("adopt: cannot read ", path, ": ", strerror(errno)));
  }
  std::string bytes;
  char buffer[8192];
  while (true) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("adopt: cannot read ", path, ": ", strerror(errno)));
    }
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
  }
  std::vector<std::string> strings;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t end = bytes.find('\0', at);
    const size_t stop = end == std::string::npos ? bytes.size() : end;
    strings.emplace_back(bytes, at, stop - at);
    at = stop + 1;
  }
  return strings;
}

// "" if equal, else what differs first (for the adoption's error).
std::string FirstDifference(const std::vector<std::string>& got,
                            const std::vector<std::string>& want) {
  for (size_t i = 0; i < std::max(got.size(), want.size()); ++i) {
    const std::string g = i < got.size() ? absl::StrCat("'", got[i], "'") : "nothing";
    const std::string w = i < want.size() ? absl::StrCat("'", want[i], "'") : "nothing";
    if (g != w) return absl::StrCat("entry ", i, " is ", g, ", expected ", w);
  }
  return "";
}

// Reads what is already in a pipe without blocking (a dead worker's last words).
std::string DrainPipe(int fd) {
  std::string text;
  char buffer[4096];
  while (text.size() < 4096) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0 || (p.revents & POLLIN) == 0) break;
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerProcess>> WorkerProcess::Adopt(
    const WorkerOptions& options, const AdoptedWorker& adopted,
    uint64_t generation, Listener* listener) {
  // A pid that is not our child says the fds are not the worker's either:
  // they are left alone.
  absl::StatusOr<base::ChildProcess> child = base::ChildProcess::Adopt(adopted.pid);
  if (!child.ok()) return child.status();
  base::UniqueFd channel(adopted.channel_fd);
  base::UniqueFd stderr_read(adopted.stderr_fd);
  base::UniqueFd payload_fd(adopted.payload_fd);
  // They crossed the launcher's exec; no later child of ours inherits them.
  for (int fd : {adopted.channel_fd, adopted.stderr_fd, adopted.payload_fd}) {
    if (fd >= 0) (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  // From here on `child` kills and reaps the worker on every error return.
  if (auto exit = child->TryWait()) {
    const std::string said = stderr_read.valid() ? DrainPipe(stderr_read.get()) : "";
    return absl::FailedPreconditionError(absl::StrCat(
        "the adopted worker (pid ", adopted.pid, ") exited before the daemon was up: ",
        exit->Describe(), said.empty() ? "" : absl::StrCat("; its stderr: ", said)));
  }
  struct stat st;
  if (!channel.valid() || ::fstat(channel.get(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "adopt: the worker's channel fd ", adopted.channel_fd, " is not a socket"));
  }
  if (!stderr_read.valid() || ::fstat(stderr_read.get(), &st) != 0 ||
      !S_ISFIFO(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "adopt: the worker's stderr fd ", adopted.stderr_fd, " is not a pipe"));
  }
  std::unique_ptr<WorkerProcess> worker(
      new WorkerProcess(options, generation, listener, adopted.worker_id));
  if (payload_fd.valid()) {
    auto area = ipc::PayloadArea::AdoptCreated(payload_fd.get());
    if (!area.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "adopt: the worker's payload fd ", adopted.payload_fd, ": ",
          area.status().message()));
    }
    (void)payload_fd.Release();  // the area's now
    worker->payloads_ = *std::move(area);
    worker->payloads_->CloseFd();  // the worker holds its copy; the mapping stays
  }
  // Exactly the worker Start would have spawned, or none: a launcher that
  // drifted from the daemon's options (e.g. flags given to the daemon alone)
  // would otherwise go unnoticed.
  if (worker->payloads_ != nullptr &&
      worker->payloads_->ring_bytes() !=
          (options.payload_ring_bytes + 4095) / 4096 * 4096) {
    return absl::FailedPreconditionError(absl::StrCat(
        "adopt: the worker's payload rings hold ", worker->payloads_->ring_bytes(),
        " bytes, this daemon's ", options.payload_ring_bytes));
  }
  // The ledger the daemon would have formatted, so the adopted worker
  // serves direct calls with the at-most-once promise across its death.
  if (worker->payloads_ != nullptr && options.ledger_call_slots != 0) {
    absl::Status ledger = ipc::CheckLedgerFormat(
        worker->payloads_->Ledger(), options.ledger_call_slots, kLedgerFinishedSlots);
    if (!ledger.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("adopt: the worker's payload area: ", ledger.message()));
    }
    worker->ledger_call_slots_ = options.ledger_call_slots;
  }
  const WorkerCommand want =
      BuildWorkerCommand(options, adopted.worker_id, worker->payloads_ != nullptr);
  for (const auto& [file, expected] :
       {std::pair<const char*, const std::vector<std::string>*>{"cmdline", &want.argv},
        {"environ", &want.env}}) {
    // posix_spawn returns once the worker's exec replaced its memory, a
    // moment before the kernel records where its arguments are: until then
    // /proc shows none (a launcher that execs the daemon never sees this).
    absl::StatusOr<std::vector<std::string>> got = ReadProcStrings(adopted.pid, file);
    for (int tries = 0; got.ok() && got->empty() && tries < 1000; ++tries) {
      absl::SleepFor(absl::Milliseconds(1));
      got = ReadProcStrings(adopted.pid, file);
    }
    if (!got.ok()) return got.status();
    const std::string difference = FirstDifference(*got, *expected);
    if (!difference.empty() && child->TryWait().has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the adopted worker (pid ", adopted.pid, ") exited before the daemon was up: ",
          child->TryWait()->Describe()));
    }
    if (!difference.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "adopt: the worker's ", std::string(file) == "cmdline" ? "command line" : "environment",
          " is not the one this daemon would spawn: ", difference));
    }
  }
  struct rlimit nofile {};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 &&
      ::prlimit(adopted.pid, RLIMIT_NOFILE, &nofile, nullptr) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "adopt: cannot set the worker's RLIMIT_NOFILE: ", strerror(errno)));
  }
  worker->Run(*std::move(child), std::move(channel), std::move(stderr_read));
  AGX_LOG(Debug, "worker {} (generation {}) adopted as pid {}", worker->worker_id_,
          generation, worker->pid_);
  return worker;
}

void WorkerProcess::Run(base::ChildProcess child, base::UniqueFd channel,
                        base::UniqueFd stderr_read) {
  pid_ = child.pid();
  {
    absl::MutexLock lock(&child_mu_);
    child_ = std::move(child);
  }
  channel_ = std::move(channel);
  reader_ = std::thread([this] { ReaderLoop(); });
  writer_ = std::thread([this] { WriterLoop(); });
  stderr_reader_ = std::thread([this, fd = std::move(stderr_read)]() mutable {
    StderrLoop(std::move(fd));
  });
}

WorkerProcess::~WorkerProcess() {
  {
    absl::MutexLock lock(&out_mu_);
    writer_stop_ = true;
  }
  Kill();
  if (channel_.valid()) ::shutdown(channel_.get(), SHUT_RDWR);
  if (reader_.joinable()) reader_.join();
  if (writer_.joinable()) writer_.join();
  if (stderr_reader_.joinable()) stderr_reader_.join();
}

void WorkerProcess::StderrLoop(base::UniqueFd pipe) {
  pthread_setname_np(pthread_self(), "agx-wrk-err");
  char buffer[4096];
  while (true) {
    const ssize_t n = ::read(pipe.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    // Passed through unchanged: the daemon's stderr is where operators look.
    ssize_t ignored = ::write(2, buffer, static_cast<size_t>(n));
    (void)ignored;
    absl::MutexLock lock(&stderr_mu_);
    stderr_tail_.append(buffer, static_cast<size_t>(n));
    if (stderr_tail_.size() > 2 * kStderrKeptBytes) {
      stderr_tail_.erase(0, stderr_tail_.size() - kStderrKeptBytes);
    }
  }
  absl::MutexLock lock(&stderr_mu_);
  stderr_eof_ = true;
}

std::string WorkerProcess::StderrTail() {
  absl::MutexLock lock(&stderr_mu_);
  // The pipe reaches EOF just after the exit; a crash report written in the
  // worker's last moments is worth a short wait.
  stderr_mu_.AwaitWithTimeout(absl::Condition(&stderr_eof_),
                              absl::Milliseconds(300));
  const std::string_view kept =
      std::string_view(stderr_tail_)
          .substr(stderr_tail_.size() -
                  std::min(stderr_tail_.size(), kStderrKeptBytes));
  const size_t report = kept.rfind("Fatal Python error");
  std::string tail(report != std::string_view::npos
                       ? kept.substr(report)
                       : kept.substr(kept.size() -
                                     std::min(kept.size(), kStderrTailBytes)));
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) {
    tail.pop_back();
  }
  return tail;
}

void WorkerProcess::Send(const ipc::Frame& frame) {
  std::string bytes;
  absl::Status status = ipc::AppendFrame(frame, bytes);
  if (!status.ok()) {
    // Payloads are chunked to kChunkBytes, so this is a bug, not bad input.
    AGX_LOG(Error, "dropping unencodable {} frame: {}",
            ipc::FrameTypeName(frame.type), status.ToString());
    return;
  }
  SendEncoded(std::move(bytes));
}

void WorkerProcess::SendEncoded(std::string bytes) {
  if (bytes.empty()) return;
  std::deque<Outbound> batch;
  {
    absl::MutexLock lock(&out_mu_);
    if (writer_stop_) return;
    outbound_.push_back({std::move(bytes), {}});
    if (writing_) return;  // the current owner writes it
    writing_ = true;
    batch.swap(outbound_);
  }
  const bool ok = TryWriteNow(channel_.get(), batch);
  absl::MutexLock lock(&out_mu_);
  if (!ok) {
    writer_stop_ = true;  // the reader reports the broken channel
    outbound_.clear();
  } else {
    // Whatever would have blocked goes back in front, in order; the writer
    // thread takes it (and anything queued meanwhile) from here.
    while (!batch.empty()) {
      outbound_.push_front(std::move(batch.back()));
      batch.pop_back();
    }
  }
  writing_ = false;
}

void WorkerProcess::SendWithDescriptors(std::string frame,
                                        std::vector<base::UniqueFd> fds) {
  if (frame.empty() || fds.empty()) return;
  absl::MutexLock lock(&out_mu_);
  if (writer_stop_) return;  // the descriptors close with `fds`
  // Queued even when the channel is idle: the writer thread's send may
  // block, which an inline Send never does.
  outbound_.push_back({std::move(frame), std::move(fds)});
}

void WorkerProcess::Kill() {
  absl::MutexLock lock(&child_mu_);
  child_.Kill(SIGKILL);
}

void WorkerProcess::Shutdown(absl::Duration grace) {
  ipc::Frame shutdown;
  shutdown.type = ipc::FrameType::kShutdown;
  Send(shutdown);
  {
    // Woken when the reader thread reaps the worker (TryWait, under
    // child_mu_), not at the next tick of a poll.
    absl::MutexLock lock(&child_mu_);
    if (child_mu_.AwaitWithTimeout(
            absl::Condition(+[](base::ChildProcess* child) { return !child->running(); },
                            &child_),
            grace)) {
      return;
    }
  }
  AGX_LOG(Warning, "worker {} did not exit within {}; killing", worker_id_,
          absl::FormatDuration(grace));
  Kill();
}

void WorkerProcess::WriterLoop() {
  pthread_setname_np(pthread_self(), "agx-wrk-write");
  uint64_t placed = CallsCpu::kNever;
  while (true) {
    std::deque<Outbound> batch;
    {
      absl::MutexLock lock(&out_mu_);
      out_mu_.Await(absl::Condition(
          +[](WorkerProcess* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->out_mu_) {
            return w->writer_stop_ || (!w->writing_ && !w->outbound_.empty());
          },
          this));
      if (writer_stop_) return;
      writing_ = true;
      batch.swap(outbound_);
    }
    if (calls_cpu_) calls_cpu_->Follow(&placed);
    // I/O happens outside the lock. On failure the reader sees the same
    // breakage as EOF and reports the exit.
    const bool ok = WriteBatch(channel_.get(), batch);
    absl::MutexLock lock(&out_mu_);
    writing_ = false;
    if (!ok) {
      writer_stop_ = true;
      outbound_.clear();
      return;
    }
  }
}

absl::Status WorkerProcess::TakeRingPayload(ipc::Frame& frame) {
  if (payloads_ == nullptr) {
    return absl::InvalidArgumentError(
        "ring payload reference without a payload area");
  }
  auto view = payloads_->Get(frame.ring_pos, frame.ring_size);
  if (!view.ok()) return view.status();
  // The retained copy (kept until the host acknowledges the result): sized
  // without the zero fill so that a large piece is streamed into it once
  // (DECISIONS, "The daemon's retained copy of large results").
  base::ResizeUninitialized(frame.data, view->size());
  base::CopyPayloadToHeap(frame.data.data(), view->data(), view->size(),
                          view->size());
  payloads_->Release(frame.ring_pos + frame.ring_size);
  frame.in_ring = false;
  return absl::OkStatus();
}

absl::Duration WorkerProcess::SpinUntilReadable(absl::Duration window) {
  char byte;
  const absl::Time waiting_since = absl::Now();
  if (window >= absl::Microseconds(1)) {
    const absl::Time until = waiting_since + window;
    do {
      const ssize_t n =
          ::recv(channel_.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        return window;  // readable, EOF or broken: the read says which
      }
    } while (absl::Now() < until);
  }
  // Block here (not in the read) to learn how long the wait was.
  pollfd pfd{channel_.get(), POLLIN, 0};
  while (::poll(&pfd, 1, -1) < 0 && errno == EINTR) {
  }
  // As the reaction thread's spin (server_stream.cc): the whole wait counts;
  // double after a short one, halve after a long one.
  return absl::Now() - waiting_since <= read_spin_
             ? std::min(read_spin_, std::max(window * 2, absl::Microseconds(1)))
             : window / 2;
}

void WorkerProcess::PublishPlacement() {
  if (!calls_cpu_ || !payloads_) return;
  // Loaded under the lock: the last caller publishes the latest state.
  absl::MutexLock lock(&placement_mu_);
  const uint64_t state = calls_cpu_->state();
  if (state == published_placement_) return;
  published_placement_ = state;
  payloads_->PublishWaitCpu(CallsCpu::CpuOf(state));
}

void WorkerProcess::ReaderLoop() {
  pthread_setname_np(pthread_self(), "agx-wrk-read");
  // The placement of --calls_cpu, for this thread, and published to the
  // worker, whose threads pin only their waits for our frames to it
  // (sandbox/calls_cpu.h).
  uint64_t placed = CallsCpu::kNever;
  auto follow = [&] {
    const uint64_t before = placed;
    calls_cpu_->Follow(&placed);
    if (payloads_ && placed != before) PublishPlacement();
  };
  if (calls_cpu_) follow();
  ipc::FrameReader reader;
  bool ready = false;
  bool timed_out = false;
  std::string protocol_error;
  std::string boot_error;
  const absl::Time ready_deadline = absl::Now() + ready_timeout_;

  absl::Duration spin_window = read_spin_;
  std::vector<ipc::Frame> frames;
  while (protocol_error.empty()) {
    int timeout_ms = -1;
    if (!ready) {
      timeout_ms = static_cast<int>(std::max<int64_t>(
          0, absl::ToInt64Milliseconds(ready_deadline - absl::Now())));
    } else if (read_spin_ > absl::ZeroDuration()) {
      spin_window = SpinUntilReadable(spin_window);
      timeout_ms = 0;  // readable (or ended): poll only confirms it
    }
    // poll before read, not a blocking read: a reader blocked in read() is
    // also woken whenever the worker drains the daemon's frames (the
    // socket's write-space wake-up shares its wait queue), ~1 extra
    // wake-up per call (measured); poll(POLLIN) ignores those.
    pollfd pfd{channel_.get(), POLLIN, 0};
    int rc = ::poll(&pfd, 1, timeout_ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) {
      if (ready) continue;
      timed_out = true;
      break;
    }
    auto n = ipc::ReadInto(channel_.get(), reader);
    if (!n.ok() || *n == 0) break;  // EOF or a broken channel
    // One vector for every read, emptied after each: a burst of log frames
    // is thousands per read, and growing a fresh vector frame by frame moved
    // them all again at each doubling (a fifth of the daemon's CPU per
    // record; each large allocation also made glibc consolidate its fast
    // bins). Sized from the length prefixes, capped: a hostile worker's tiny
    // frames must not make it reserve 656 bytes per few it sent. One more
    // than the frames: the loop below places the next frame before it knows
    // whether there is one.
    constexpr size_t kMaxReserved = 1024;
    frames.reserve(std::min(reader.CompleteFrames(), kMaxReserved) + 1);
    while (true) {
      // Decoded in place: no Frame moved per frame (ipc::FrameReader::NextInto).
      ipc::Frame& frame = frames.emplace_back();
      absl::StatusOr<bool> got = reader.NextInto(frame);
      if (!got.ok() || !*got) {
        frames.pop_back();
        if (!got.ok()) protocol_error = std::string(got.status().message());
        break;
      }
      if (frame.in_ring) {
        absl::Status taken = TakeRingPayload(frame);
        if (!taken.ok()) {
          protocol_error = std::string(taken.message());
          frames.pop_back();
          break;
        }
      }
      if (frame.type == ipc::FrameType::kDirectClosed) {
        // The daemon's bookkeeping, not a call's: the session never sees it.
        if (direct_listener_ == nullptr) {
          protocol_error = "a 'direct_closed' frame, but no connection was "
                           "handed over (--direct_calls is off)";
          frames.pop_back();
          break;
        }
        direct_listener_->OnDirectClosed(generation_, frame.direct_conn.conn,
                                         frame.detail);
        frames.pop_back();
        continue;
      }
      if (frame.type == ipc::FrameType::kReady) {
        ready = true;
        direct_capable_.store(frame.direct, std::memory_order_release);
        booted_.store(true, std::memory_order_release);
        AGX_LOG(Debug, "worker {} ready: python {}", worker_id_, frame.detail);
      } else if (frame.type == ipc::FrameType::kBootError) {
        boot_error = frame.error.type.empty()
                         ? frame.error.message
                         : absl::StrCat(frame.error.type, ": ",
                                        frame.error.message);
      }
    }
    if (calls_cpu_) {
      int call_ends = 0;
      for (const ipc::Frame& frame : frames) {
        call_ends += frame.type == ipc::FrameType::kResult ||
                     frame.type == ipc::FrameType::kError;
      }
      calls_cpu_->NoteRead(call_ends);
      follow();
    }
    if (!frames.empty()) listener_->OnWorkerFrames(generation_, frames);
    if (frames.capacity() > 4 * kMaxReserved) {
      frames = {};  // a rare huge read does not pin its memory
    } else {
      frames.clear();
    }
  }

  if (timed_out || !protocol_error.empty()) Kill();
  {
    absl::MutexLock lock(&out_mu_);
    writer_stop_ = true;
    outbound_.clear();
  }
  // Reap: give a worker that is exiting by itself a moment, then insist.
  std::optional<base::ExitStatus> exit;
  const absl::Time reap_deadline = absl::Now() + absl::Seconds(2);
  while (true) {
    {
      absl::MutexLock lock(&child_mu_);
      exit = child_.TryWait();
      if (!exit && absl::Now() >= reap_deadline) child_.Kill(SIGKILL);
    }
    if (exit) break;
    absl::SleepFor(absl::Milliseconds(2));
  }

  WorkerExit result;
  result.returncode = exit->returncode();
  std::string how = exit->Describe();
  if (exit->signal == SIGKILL && !timed_out && protocol_error.empty()) {
    how += " (likely OOM-killed or killed from outside)";
  }
  if (!boot_error.empty()) {
    result.error_type = "WorkerBootError";
    result.message = absl::StrCat("runtime worker failed to boot: ", boot_error);
  } else if (timed_out) {
    result.error_type = "WorkerBootError";
    result.message = absl::StrCat(
        "runtime worker did not become ready within ",
        absl::FormatDuration(ready_timeout_), "; killed");
  } else if (!ready) {
    result.error_type = "WorkerBootError";
    result.message =
        absl::StrCat("runtime worker exited before ready (", how, ")");
  } else if (!protocol_error.empty()) {
    result.error_type = "WorkerDied";
    result.message = absl::StrCat(
        "runtime worker broke the frame protocol (", protocol_error,
        "); killed: ", how);
  } else {
    result.error_type = "WorkerDied";
    result.message = absl::StrCat("runtime worker exited: ", how);
  }
  const std::string tail = StderrTail();
  if (!tail.empty() && boot_error.empty()) {
    absl::StrAppend(&result.message, "; last stderr output:\n", tail);
  }
  AGX_LOG(Info, "worker {} pid {}: {}", worker_id_, pid_, result.message);
  // The kernel closed the connections it held: they are no longer counted.
  if (direct_listener_ != nullptr) direct_listener_->OnDirectWorkerGone(generation_);
  listener_->OnWorkerExit(generation_, result);
}

absl::StatusOr<uint32_t> WorkerProcess::LedgerClientSlot(
    const std::string& client) {
  if (ledger_call_slots_ == 0 || payloads_ == nullptr) {
    return absl::FailedPreconditionError("the worker's payload area has no ledger");
  }
  absl::MutexLock lock(&ledger_mu_);
  return ledger_clients_.SlotOf(client);
}

absl::StatusOr<ipc::LedgerContents> WorkerProcess::ReadLedger() {
  absl::MutexLock lock(&ledger_mu_);
  if (ledger_call_slots_ == 0 || payloads_ == nullptr ||
      ledger_clients_.size() == 0) {
    return ipc::LedgerContents{};
  }
  return ipc::ReadLedger(payloads_->Ledger(), ledger_call_slots_,
                         kLedgerFinishedSlots, ledger_clients_);
}

}  // namespace agentix::sandbox
