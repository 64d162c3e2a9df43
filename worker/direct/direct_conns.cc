#include "worker/direct/direct_conns.h"

#include <errno.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "wire/frame_connection.h"

namespace agentix::worker {

using sandbox::FrameConnection;
using sandbox::FrameConnectionConsumer;
using sandbox::FrameConnectionOptions;
using sandbox::SandboxEventPtr;
using sandbox::SplicedRequest;

// The driver sink every session shares: records queued for the intake.
// The queue and the intake's vector swap on each take, so both keep their
// capacity: a batch's frames are moved in once, never into a vector grown
// from empty (stop 40: the direct worker's malloc and Frame moves).
class DirectConns::Driver final : public DriverSink {
 public:
  void Send(std::vector<ipc::Frame> frames) override {
    absl::MutexLock lock(&mu_);
    for (ipc::Frame& f : frames) pending_.push_back(std::move(f));
  }
  bool Land(ipc::Frame& frame, std::string_view bytes) override {
    return land_ != nullptr && land_(frame, bytes);
  }
  // `taken`'s old frames are dropped; it gets the queued ones.
  void Take(std::vector<ipc::Frame>& taken) {
    taken.clear();
    absl::MutexLock lock(&mu_);
    pending_.swap(taken);
  }

  ArgumentHome land_;  // set before any connection; poll side only

 private:
  absl::Mutex mu_;
  std::vector<ipc::Frame> pending_ ABSL_GUARDED_BY(mu_);
};

// One handed-over connection: its transport's consumer (requests go to the
// session) and the session's sink for the calls it started or resumed.
class DirectConns::Conn final : public FrameConnectionConsumer,
                                public DirectResponseSink {
 public:
  Conn(uint64_t number, uint32_t follow, std::shared_ptr<DirectSession> session)
      : number_(number), follow_(follow), session_(std::move(session)) {}

  void Attach(std::unique_ptr<FrameConnection> connection,
              std::weak_ptr<Conn> self) {
    connection_ = std::move(connection);
    self_ = std::move(self);
  }

  // ---- FrameConnectionConsumer (poll side) ----
  void OnRequest(SplicedRequest& request) override {
    std::shared_ptr<Conn> self = self_.lock();
    // After a collapse the host's requests are the daemon's: it re-sends
    // them on its next connection.
    if (self == nullptr || collapsed_) return;
    session_->HandleRequest(self, request.request, request.bulk);
  }
  void OnHalfClose() override {
    half_closed_.store(true);
    FinishIfDrained();
  }
  void OnEnd(absl::Status why) override {
    ended_ = true;
    why_ = why.ok() ? "status 0 written"
                    : absl::StrCat(absl::StatusCodeToString(why.code()), ": ",
                                   why.message());
  }

  // ---- DirectResponseSink (any thread, under the session's lock) ----
  // Held until Flush, so that the replies of one batch of calls share one
  // write, as the link's replies share one write per flush().
  void Send(std::vector<SandboxEventPtr> events) override {
    absl::MutexLock lock(&mu_);
    if (held_.empty()) {
      held_ = std::move(events);
    } else {
      for (SandboxEventPtr& e : events) held_.push_back(std::move(e));
    }
  }

  // Writes what Send held (non-blocking; the rest is queued for the poll
  // side). Over the bound the poll side's stalled-host deadline ends the
  // connection with STATUS 8, its calls kept for a resume.
  void Flush() {
    std::vector<SandboxEventPtr> events;
    {
      absl::MutexLock lock(&mu_);
      events.swap(held_);
    }
    if (!events.empty()) (void)connection_->Send(events);
  }

  // A half-closed connection ends (STATUS 0) once its calls are terminal;
  // their events are written first, so the STATUS follows them.
  void FinishIfDrained() {
    if (half_closed_.load() && !session_->HasOpenCalls(this)) {
      Flush();
      connection_->Finish(absl::StatusCode::kOk, "");
    }
  }

  // Its session went back to the daemon (poll side).
  void MarkCollapsed() { collapsed_ = true; }

  // Writes a calls-CPU answer if the host asked for it (poll side).
  void TellCallsCpu(const std::string& value) {
    if (follow_ == 0) return;
    if (follow_ == 1) follow_ = 0;  // the first answer only
    (void)connection_->SendCallsCpuAnswer(value);
  }

  FrameConnection& connection() { return *connection_; }
  DirectSession* session() const { return session_.get(); }
  uint64_t number() const { return number_; }
  bool ended() const { return ended_; }
  const std::string& why() const { return why_; }
  uint32_t watched = 0;  // the epoll events registered now (poll side)

 private:
  const uint64_t number_;
  uint32_t follow_;  // direct_conn's: 0 none, 1 the first answer, 2 changes
  const std::shared_ptr<DirectSession> session_;
  std::unique_ptr<FrameConnection> connection_;
  std::weak_ptr<Conn> self_;
  std::atomic<bool> half_closed_{false};
  absl::Mutex mu_;
  std::vector<SandboxEventPtr> held_ ABSL_GUARDED_BY(mu_);
  bool ended_ = false;  // poll side
  bool collapsed_ = false;  // poll side
  std::string why_;
};

namespace {

uint32_t EpollEvents(short poll_events) {
  uint32_t events = 0;
  if (poll_events & POLLIN) events |= EPOLLIN;
  if (poll_events & POLLOUT) events |= EPOLLOUT;
  return events;
}

void Drain(int fd) {
  uint64_t count;
  while (::read(fd, &count, sizeof count) > 0) {
  }
}

DirectLimits LimitsOf(const ipc::DirectConnInfo& info) {
  DirectLimits limits;
  if (info.max_payload > 0) limits.max_payload_bytes = info.max_payload;
  if (info.upload_idle_ms > 0) {
    limits.upload_idle_timeout = absl::Milliseconds(info.upload_idle_ms);
  }
  if (info.max_retained > 0) limits.max_retained_results = info.max_retained;
  if (info.max_retained_bytes > 0) {
    limits.max_retained_bytes = info.max_retained_bytes;
  }
  if (info.max_stream_window > 0) {
    limits.max_stream_window = static_cast<uint32_t>(
        std::min<uint64_t>(info.max_stream_window, UINT32_MAX));
  }
  if (info.stalled_ms > 0) {
    limits.stalled_host_timeout = absl::Milliseconds(info.stalled_ms);
  }
  return limits;
}

// The upload watchdog's period while an upload is watched: an idle upload
// ends at most this long after its timeout.
constexpr absl::Duration kWatchdogPeriod = absl::Seconds(1);

}  // namespace

absl::StatusOr<std::unique_ptr<DirectConns>> DirectConns::Create(
    int link_fd, ipc::PayloadArea* area) {
  base::UniqueFd epoll_fd(::epoll_create1(EPOLL_CLOEXEC));
  base::UniqueFd wake_fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  base::UniqueFd timer_fd(
      ::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!epoll_fd.valid() || !wake_fd.valid() || !timer_fd.valid()) {
    return absl::InternalError(
        absl::StrCat("direct connections' poll set: ", std::strerror(errno)));
  }
  // The daemon formats a ledger only with --direct_calls; without one (or
  // a header the worker cannot read) sessions write the counters alone.
  std::unique_ptr<ipc::LedgerWriter> ledger;
  if (area != nullptr && !area->Ledger().empty()) {
    if (auto opened = ipc::LedgerWriter::Open(area->Ledger()); opened.ok()) {
      ledger = std::move(*opened);
    }
  }
  std::unique_ptr<DirectConns> conns(
      new DirectConns(std::move(epoll_fd), std::move(wake_fd),
                      std::move(timer_fd), link_fd, area, std::move(ledger)));
  for (int fd : {link_fd, conns->wake_fd_.get(), conns->timer_fd_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(conns->epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return absl::InternalError(absl::StrCat(
          "direct connections' poll set: ", std::strerror(errno)));
    }
  }
  return conns;
}

DirectConns::DirectConns(base::UniqueFd epoll_fd, base::UniqueFd wake_fd,
                         base::UniqueFd timer_fd, int link_fd,
                         ipc::PayloadArea* area,
                         std::unique_ptr<ipc::LedgerWriter> ledger)
    : epoll_fd_(std::move(epoll_fd)),
      wake_fd_(std::move(wake_fd)),
      timer_fd_(std::move(timer_fd)),
      link_fd_(link_fd),
      area_(area),
      ledger_(std::move(ledger)),
      driver_(std::make_unique<Driver>()) {}

DirectConns::~DirectConns() {
  absl::MutexLock lock(&mu_);
  conns_.clear();  // before the sessions and the driver sink they use
  sessions_.clear();
}

void DirectConns::Watch(int fd, uint32_t events, int op) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  // Fails only for a closed fd or no memory; the connection then sees its
  // deadline or the next wake.
  (void)::epoll_ctl(epoll_fd_.get(), op, fd, &ev);
}

void DirectConns::Accept(const ipc::Frame& frame,
                         std::vector<base::UniqueFd> fds) {
  const ipc::DirectConnInfo& info = frame.direct_conn;
  const DirectLimits limits = LimitsOf(info);
  std::shared_ptr<DirectSession> session;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<DirectSession>& slot = sessions_[info.client];
    if (slot == nullptr) {
      // The client's slot is the daemon's, the same for every connection
      // of the client while this worker lives.
      const DirectRecords records{area_, ledger_.get(), info.client_slot};
      slot = std::make_shared<DirectSession>(info.client, limits, *driver_,
                                             records, chunk_buffers_);
    }
    session = slot;
    latest_conn_[info.client] = info.conn;
  }
  auto conn = std::make_shared<Conn>(info.conn, info.follow, session);
  FrameConnectionOptions options;
  options.max_unwritten_bytes = limits.max_retained_bytes;
  options.stalled_host_timeout = limits.stalled_host_timeout;
  const int wake = wake_fd_.get();
  options.wake = [wake] {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake, &one, sizeof one);
  };
  const int socket = fds.empty() ? -1 : fds[0].Release();
  const int ring = fds.size() > 1 ? fds[1].Release() : -1;
  absl::StatusOr<std::unique_ptr<FrameConnection>> made =
      FrameConnection::Create(socket, frame.data, ring, conn.get(),
                              std::move(options));
  if (!made.ok()) {
    absl::MutexLock lock(&mu_);
    closed_.emplace_back(info.conn,
                         absl::StrCat("refused: ", made.status().message()));
    return;
  }
  conn->Attach(std::move(*made), conn);
  const int fd = conn->connection().fd();
  {
    absl::MutexLock lock(&mu_);
    conns_[fd] = conn;
  }
  conn->watched = EPOLLIN;
  Watch(fd, EPOLLIN, EPOLL_CTL_ADD);
  // An answer that changed after the daemon answered this host's HELLO
  // reached the link before this connection did.
  if (!calls_cpu_answer_.empty()) conn->TellCallsCpu(calls_cpu_answer_);
  conn->connection().Start();
  Drive();  // its state after `pre`: interest, end, deadlines
}

void DirectConns::TellCallsCpu(const std::string& value) {
  calls_cpu_answer_ = value;
  std::vector<std::shared_ptr<Conn>> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [fd, conn] : conns_) all.push_back(conn);
  }
  for (const auto& conn : all) conn->TellCallsCpu(value);
  Drive();  // what was queued gets written
}

void DirectConns::Reap(const std::shared_ptr<Conn>& conn) {
  const int fd = conn->connection().fd();
  Watch(fd, 0, EPOLL_CTL_DEL);
  conn->session()->Detach(conn.get());
  absl::MutexLock lock(&mu_);
  closed_.emplace_back(conn->number(), conn->why());
  conns_.erase(fd);
}

void DirectConns::ArmTimer(absl::Time at) {
  if (at == timer_at_) return;
  timer_at_ = at;
  itimerspec spec{};
  if (at != absl::InfiniteFuture()) {
    const absl::Duration in =
        std::max(at - absl::Now(), absl::Microseconds(100));
    spec.it_value = absl::ToTimespec(in);
  }
  ::timerfd_settime(timer_fd_.get(), 0, &spec, nullptr);
}

void DirectConns::Drive() {
  // Reused across calls (capacity kept); emptied on return, so that a
  // reaped connection is not kept alive until the next Drive.
  std::vector<std::shared_ptr<Conn>>& all = drive_conns_;
  std::vector<std::shared_ptr<DirectSession>>& sessions = drive_sessions_;
  {
    absl::MutexLock lock(&mu_);
    if (conns_.empty() && sessions_.empty()) return;
    for (auto& [fd, conn] : conns_) all.push_back(conn);
    for (auto& [client, session] : sessions_) sessions.push_back(session);
  }
  epoll_event events[64];
  const int n = ::epoll_wait(epoll_fd_.get(), events, 64, 0);
  bool timer_fired = false;
  for (int i = 0; i < n; ++i) {
    const int fd = events[i].data.fd;
    if (fd == wake_fd_.get()) {
      Drain(fd);
      continue;
    }
    if (fd == timer_fd_.get()) {
      Drain(fd);
      timer_fired = true;
      continue;
    }
    if (fd == link_fd_) continue;
    auto it = std::find_if(all.begin(), all.end(), [fd](const auto& c) {
      return c->connection().fd() == fd;
    });
    if (it == all.end()) continue;
    FrameConnection& c = (*it)->connection();
    if (events[i].events & EPOLLOUT) c.WriteReady();
    if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) c.ReadReady();
  }
  if (timer_fired) timer_at_ = absl::InfiniteFuture();
  for (const auto& conn : all) conn->Flush();
  const absl::Time now = absl::Now();
  absl::Time next = absl::InfiniteFuture();
  for (const auto& session : sessions) {
    if (session->ExpireUploads(now)) next = now + kWatchdogPeriod;
  }
  for (const auto& conn : all) {
    FrameConnection& c = conn->connection();
    if (!c.Done() && c.NextDeadline() <= now) c.OnDeadline();
    if (c.Done()) {
      Reap(conn);
      continue;
    }
    next = std::min(next, c.NextDeadline());
    const uint32_t want = EpollEvents(c.PollEvents());
    if (want != conn->watched) {
      conn->watched = want;
      Watch(c.fd(), want, EPOLL_CTL_MOD);
    }
  }
  ArmTimer(next);
  all.clear();
  sessions.clear();
}

void DirectConns::LandArgumentsIn(ArgumentHome home) {
  driver_->land_ = std::move(home);
}

std::vector<ipc::Frame>& DirectConns::TakeDriverFrames(
    uint64_t untagged) {
  std::vector<ipc::Frame>& frames = taken_;
  driver_->Take(frames);
  absl::MutexLock lock(&side_mu_);
  for (const ipc::Frame& f : frames) {
    if (f.type != ipc::FrameType::kCall) continue;
    CallRecords& call = records_[f.call_id];
    call = CallRecords();
    call.untagged_mark = untagged;
  }
  return frames;
}

namespace {

bool IsStamped(ipc::FrameType type) {
  return type == ipc::FrameType::kResult || type == ipc::FrameType::kError ||
         type == ipc::FrameType::kStreamItem;
}

bool NeedsBarrier(const std::vector<ipc::Frame>& frames) {
  for (const ipc::Frame& f : frames) {
    if (IsStamped(f.type)) return true;
  }
  return false;
}

bool EndsCall(const std::vector<ipc::Frame>& frames) {
  for (const ipc::Frame& f : frames) {
    if (f.type == ipc::FrameType::kResult || f.type == ipc::FrameType::kError) {
      return true;
    }
  }
  return false;
}

}  // namespace

bool DirectConns::AskIfLogged(const std::string& call_id, CallRecords& call,
                              const std::vector<ipc::Frame>& frames,
                              uint64_t untagged, std::string& link_out) {
  const bool saw_untagged = untagged > call.untagged_mark;
  if (!NeedsBarrier(frames) || !(call.tagged || saw_untagged)) return false;
  ipc::Frame ask;
  ask.type = ipc::FrameType::kBarrierAsk;
  ask.call_id = call_id;
  ask.untagged = saw_untagged;
  if (!ipc::AppendFrame(ask, link_out).ok()) return false;  // an id too long
  call.tagged = false;
  call.untagged_mark = untagged;
  call.asking = true;
  ++barrier_asks_;
  return true;
}

uint64_t DirectConns::TagRecord(std::string_view call_id) {
  uint64_t conn = 0;
  {
    absl::MutexLock lock(&side_mu_);
    auto it = records_.find(std::string(call_id));
    if (it == records_.end()) return 0;
    it->second.tagged = true;
    conn = it->second.conn;
  }
  if (conn != 0) return conn;
  // Its first record: the client's latest connection.
  {
    absl::MutexLock lock(&mu_);
    const std::string id(call_id);
    for (auto& [client, session] : sessions_) {
      if (!session->Runs(id)) continue;
      auto latest = latest_conn_.find(client);
      if (latest != latest_conn_.end()) conn = latest->second;
      break;
    }
  }
  absl::MutexLock lock(&side_mu_);
  auto it = records_.find(std::string(call_id));
  if (it != records_.end()) it->second.conn = conn;
  return conn;
}

uint64_t DirectConns::barrier_asks() {
  absl::MutexLock lock(&side_mu_);
  return barrier_asks_;
}

std::vector<std::pair<uint64_t, std::string>> DirectConns::TakeClosed() {
  absl::MutexLock lock(&mu_);
  return std::exchange(closed_, {});
}

std::shared_ptr<DirectSession> DirectConns::SessionOf(
    const std::string& client) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(client);
  return it == sessions_.end() ? nullptr : it->second;
}

std::vector<ipc::Frame> DirectConns::Collapse(const std::string& client) {
  std::shared_ptr<DirectSession> session;
  std::vector<std::shared_ptr<Conn>> conns;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(client);
    if (it != sessions_.end()) {
      session = std::move(it->second);
      sessions_.erase(it);
      for (auto& [fd, conn] : conns_) {
        if (conn->session() == session.get()) conns.push_back(conn);
      }
    }
  }
  if (session == nullptr) {
    std::vector<ipc::Frame> frames(1);
    frames[0].type = ipc::FrameType::kSessionState;
    frames[0].direct_conn.client = client;
    frames[0].last = true;
    return frames;
  }
  // What they were sent is theirs; the STATUS follows it. Drive reaps them
  // (direct_closed) once it is written or the finish grace is over.
  for (const auto& conn : conns) {
    conn->MarkCollapsed();
    conn->Flush();
    conn->connection().Finish(absl::StatusCode::kUnavailable,
                              "the sandbox daemon took this client's calls "
                              "back; reconnect and resume");
  }
  return session->Collapse();
}

bool DirectConns::Owns(const std::string& call_id) {
  absl::MutexLock lock(&mu_);
  for (auto& [client, session] : sessions_) {
    if (session->Runs(call_id)) return true;
  }
  return false;
}

void DirectConns::FinishHalfClosed(DirectSession* session) {
  std::vector<std::shared_ptr<Conn>> conns;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [fd, conn] : conns_) {
      if (conn->session() == session) conns.push_back(conn);
    }
  }
  for (const auto& conn : conns) conn->FinishIfDrained();
}

bool DirectConns::Reply(std::vector<ipc::Frame> frames, uint64_t untagged,
                        std::string& link_out) {
  if (frames.empty()) return true;
  const std::string& id = frames.front().call_id;
  {
    absl::MutexLock lock(&side_mu_);
    auto it = records_.find(id);
    if (it != records_.end()) {
      CallRecords& call = it->second;
      if (call.asking || AskIfLogged(id, call, frames, untagged, link_out)) {
        call.held.push_back(std::move(frames));
        return true;
      }
      if (EndsCall(frames)) records_.erase(it);
    }
  }
  return Deliver(frames);
}

void DirectConns::OnBarrier(const ipc::Frame& answer, uint64_t untagged,
                            std::string& link_out) {
  std::vector<std::vector<ipc::Frame>> release;
  {
    absl::MutexLock lock(&side_mu_);
    auto it = records_.find(answer.call_id);
    if (it == records_.end() || !it->second.asking) return;  // not asked
    CallRecords& call = it->second;
    call.asking = false;
    bool ended = false;
    for (size_t i = 0; i < call.held.size(); ++i) {
      std::vector<ipc::Frame>& frames = call.held[i];
      if (i == 0) {
        for (ipc::Frame& f : frames) {
          if (!IsStamped(f.type)) continue;
          f.log_seq = answer.log_seq;
          f.trace_seq = answer.trace_seq;
        }
      } else if (AskIfLogged(answer.call_id, call, frames, untagged, link_out)) {
        call.held.erase(call.held.begin(), call.held.begin() + i);
        break;
      }
      ended |= EndsCall(frames);
      release.push_back(std::move(frames));
    }
    if (!call.asking) {
      call.held.clear();
      if (ended) records_.erase(it);
    }
  }
  for (std::vector<ipc::Frame>& frames : release) (void)Deliver(frames);
}

bool DirectConns::Deliver(std::vector<ipc::Frame>& frames) {
  std::shared_ptr<DirectSession> owner;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [client, session] : sessions_) {
      if (session->Runs(frames.front().call_id)) {
        owner = session;
        break;
      }
    }
  }
  if (owner == nullptr) return false;
  // Only call output reaches here (the channel's send_* entry points).
  (void)owner->HandleDriverFrames(frames);
  FinishHalfClosed(owner.get());
  return true;
}

void DirectConns::FinishAll(absl::StatusCode code, const std::string& message) {
  // Output held for a barrier the daemon will not answer now: written
  // without its seqs rather than lost.
  std::vector<std::vector<ipc::Frame>> held;
  {
    absl::MutexLock lock(&side_mu_);
    for (auto& [id, call] : records_) {
      for (auto& frames : call.held) held.push_back(std::move(frames));
    }
    records_.clear();
  }
  for (std::vector<ipc::Frame>& frames : held) (void)Deliver(frames);
  std::vector<std::shared_ptr<Conn>> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [fd, conn] : conns_) all.push_back(conn);
  }
  for (const auto& conn : all) {
    conn->Flush();
    conn->connection().Finish(code, message);
  }
  // Written, or given up after each connection's finish grace (2 s).
  while (true) {
    std::vector<pollfd> fds;
    absl::Time next = absl::InfiniteFuture();
    for (const auto& conn : all) {
      FrameConnection& c = conn->connection();
      if (c.Done()) continue;
      fds.push_back({c.fd(), c.PollEvents(), 0});
      next = std::min(next, c.NextDeadline());
    }
    if (fds.empty()) break;
    const absl::Duration wait =
        std::clamp(next - absl::Now(), absl::ZeroDuration(),
                   absl::Milliseconds(100));
    ::poll(fds.data(), fds.size(),
           static_cast<int>(absl::ToInt64Milliseconds(wait)) + 1);
    for (const auto& conn : all) {
      FrameConnection& c = conn->connection();
      if (c.Done()) continue;
      c.WriteReady();
      c.ReadReady();
      if (!c.Done() && c.NextDeadline() <= absl::Now()) c.OnDeadline();
    }
  }
  for (const auto& conn : all) Reap(conn);
}

void DirectConns::FlushReplies() {
  std::vector<std::shared_ptr<Conn>> all;
  {
    absl::MutexLock lock(&mu_);
    if (conns_.empty()) return;
    for (auto& [fd, conn] : conns_) all.push_back(conn);
  }
  for (const auto& conn : all) conn->Flush();
}

size_t DirectConns::connections() {
  absl::MutexLock lock(&mu_);
  return conns_.size();
}

size_t DirectConns::sessions() {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace agentix::worker
