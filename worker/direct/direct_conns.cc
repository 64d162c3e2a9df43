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
#include "agentix/runtime/v1/runtime.pb.h"
#include "wire/namespace_rules.h"
#include "wire/wire_limits.h"
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
  void Send(absl::Span<ipc::Frame> frames) override {
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
  // A Namespace stream's (docs/DIRECT-CALLS.md stage 8): no session; the
  // host's events go to `driver` as the daemon's ns_event frames would.
  Conn(uint64_t number, std::string ns_name, std::string instance_id,
       DriverSink* driver)
      : number_(number),
        follow_(0),
        ns_name_(std::move(ns_name)),
        instance_id_(std::move(instance_id)),
        driver_(driver) {}

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
  // A Namespace stream's message: the checks the daemon applies to a
  // relayed stream's (NamespaceStream::Handle), then the event goes to
  // the sandbox; a failed check ends the stream with the daemon's status.
  void OnMessage(absl::string_view payload) override {
    request_.Clear();
    if (!request_.ParseFromArray(payload.data(),
                                 static_cast<int>(payload.size()))) {
      connection_->Finish(absl::StatusCode::kInvalidArgument,
                          "unparseable NamespaceRequest message (not a valid "
                          "protobuf encoding)");
      return;
    }
    if (request_.has_open()) {
      connection_->Finish(
          absl::StatusCode::kFailedPrecondition,
          absl::StrCat("this stream already carries namespace ", ns_name_,
                       "; open one stream per namespace"));
      return;
    }
    if (!request_.has_event()) return;  // an empty message: nothing to do
    const runtime::v1::NamespaceEvent& event = request_.event();
    const absl::Status valid = sandbox::CheckHostNamespaceEvent(event);
    if (!valid.ok()) {
      connection_->Finish(valid.code(), valid.message());
      return;
    }
    ipc::Frame frame = sandbox::NamespaceEventFrame(ns_name_, event);
    driver_->Send(absl::MakeSpan(&frame, 1));
  }
  bool opened_owed() const { return opened_owed_; }  // under DirectConns' mu_
  // Whether `opened` is still owed (once true). Under DirectConns' mu_.
  bool TakeOpenedOwed() {
    const bool owed = opened_owed_;
    opened_owed_ = false;
    return owed;
  }
  // The answer to the host's OpenNamespace, which the daemon leaves to the
  // worker so that the host starts after the worker took the stream.
  void SendOpened() {
    runtime::v1::NamespaceResponse opened;
    opened.set_namespace_(ns_name_);
    opened.set_instance_id(instance_id_);
    opened.set_opened(true);
    (void)connection_->SendMessages({opened.SerializeAsString()});
  }
  // One sandbox event for the host (any thread): a NamespaceResponse as
  // the daemon writes it, written now or queued.
  void SendNamespaceEvent(const ipc::Frame& frame) {
    runtime::v1::NamespaceResponse response;
    response.set_namespace_(ns_name_);
    response.set_instance_id(instance_id_);
    sandbox::FillNamespaceEvent(frame, *response.add_events());
    (void)connection_->SendMessages({response.SerializeAsString()});
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
  void Send(absl::Span<SandboxEventPtr> events) override {
    absl::MutexLock lock(&mu_);
    for (SandboxEventPtr& e : events) held_.push_back(std::move(e));
  }

  // Writes what Send held (non-blocking; the rest is queued for the poll
  // side). Over the bound the poll side's stalled-host deadline ends the
  // connection with STATUS 8, its calls kept for a resume. The held and
  // the flushing vector swap, so both keep their capacity (stop 42: no
  // vector a reply); one flush at a time keeps the batches in order.
  void Flush() {
    absl::MutexLock flushing(&flush_mu_);
    {
      absl::MutexLock lock(&mu_);
      flushing_.swap(held_);
    }
    if (!flushing_.empty()) (void)connection_->Send(flushing_);
    flushing_.clear();
  }

  // A half-closed connection ends (STATUS 0) once its calls are terminal;
  // their events are written first, so the STATUS follows them.
  void FinishIfDrained() {
    if (half_closed_.load() &&
        (session_ == nullptr || !session_->HasOpenCalls(this))) {
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
  const std::string& ns_name() const { return ns_name_; }
  bool half_closed() const { return half_closed_.load(); }
  uint64_t number() const { return number_; }
  bool ended() const { return ended_; }
  const std::string& why() const { return why_; }
  uint32_t watched = 0;  // the epoll events registered now (poll side)

 private:
  const uint64_t number_;
  uint32_t follow_;  // direct_conn's: 0 none, 1 the first answer, 2 changes
  const std::shared_ptr<DirectSession> session_;
  const std::string ns_name_;      // a Namespace stream's name, else empty
  const std::string instance_id_;  // a Namespace stream's
  DriverSink* const driver_ = nullptr;  // a Namespace stream's
  runtime::v1::NamespaceRequest request_;  // poll side
  bool opened_owed_ = true;  // a Namespace stream's, under DirectConns' mu_
  std::unique_ptr<FrameConnection> connection_;
  std::weak_ptr<Conn> self_;
  std::atomic<bool> half_closed_{false};
  absl::Mutex mu_;
  std::vector<SandboxEventPtr> held_ ABSL_GUARDED_BY(mu_);
  absl::Mutex flush_mu_;  // taken before mu_
  std::vector<SandboxEventPtr> flushing_ ABSL_GUARDED_BY(flush_mu_);
  bool ended_ = false;  // poll side
  bool collapsed_ = false;  // poll side
  std::string why_;
};

namespace {

// Makes the poll set readable (its wake eventfd; Drive drains it). Cannot
// fail short of a programming error (the counter is far from full).
void WriteWake(int wake_fd) {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd, &one, sizeof one);
}

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
  if (!info.ns_name.empty()) {
    AcceptNamespace(frame, std::move(fds));
    return;
  }
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
  if (!Open(conn, frame, std::move(fds), std::move(options))) return;
  // An answer that changed after the daemon answered this host's HELLO
  // reached the link before this connection did.
  if (!calls_cpu_answer_.empty()) conn->TellCallsCpu(calls_cpu_answer_);
  conn->connection().Start();
  Drive();  // its state after `pre`: interest, end, deadlines
}

void DirectConns::AcceptNamespace(const ipc::Frame& frame,
                                  std::vector<base::UniqueFd> fds) {
  const ipc::DirectConnInfo& info = frame.direct_conn;
  auto conn = std::make_shared<Conn>(info.conn, info.ns_name,
                                     info.instance_id, driver_.get());
  FrameConnectionOptions options;
  options.raw_messages = true;
  if (info.max_retained_bytes > 0) {
    options.max_unwritten_bytes = info.max_retained_bytes;
  }
  if (info.stalled_ms > 0) {
    options.stalled_host_timeout = absl::Milliseconds(info.stalled_ms);
  }
  if (!Open(conn, frame, std::move(fds), std::move(options))) return;
  conn->connection().Start();
  Drive();
}

bool DirectConns::Open(const std::shared_ptr<Conn>& conn,
                       const ipc::Frame& frame,
                       std::vector<base::UniqueFd> fds,
                       FrameConnectionOptions options) {
  const ipc::DirectConnInfo& info = frame.direct_conn;
  const int wake = wake_fd_.get();
  options.wake = [wake] { WriteWake(wake); };
  const int socket = fds.empty() ? -1 : fds[0].Release();
  // A Namespace stream has no ring.
  const int ring =
      info.ns_name.empty() && fds.size() > 1 ? fds[1].Release() : -1;
  absl::StatusOr<std::unique_ptr<FrameConnection>> made =
      FrameConnection::Create(socket, frame.data, ring, conn.get(),
                              std::move(options));
  if (!made.ok()) {
    absl::MutexLock lock(&mu_);
    closed_.emplace_back(info.conn,
                         absl::StrCat("refused: ", made.status().message()));
    return false;
  }
  conn->Attach(std::move(*made), conn);
  const int fd = conn->connection().fd();
  {
    absl::MutexLock lock(&mu_);
    conns_[fd] = conn;
    // One direct stream a name (the daemon's rule): the latest wins.
    if (!info.ns_name.empty()) namespaces_[info.ns_name] = conn;
  }
  conn->watched = EPOLLIN;
  Watch(fd, EPOLLIN, EPOLL_CTL_ADD);
  return true;
}

void DirectConns::OnHostConnected(const std::string& name) {
  std::shared_ptr<Conn> conn;
  {
    absl::MutexLock lock(&mu_);
    auto it = namespaces_.find(name);
    if (it == namespaces_.end() || !it->second->TakeOpenedOwed()) return;
    conn = it->second;
  }
  conn->SendOpened();
  Drive();
}

bool DirectConns::SendNamespaceEvent(const ipc::Frame& frame) {
  // One the daemon drops (over one message's limit) goes its way: the
  // hosts' logs say so.
  if (frame.data.size() + frame.ns.event.size() + frame.ns.request_id.size() +
          frame.ns.error_type.size() + frame.ns.error_message.size() +
          frame.ns.name.size() + 64 >
      sandbox::kMaxWireItemBytes) {
    return false;
  }
  std::shared_ptr<Conn> conn;
  bool relayed = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = namespaces_.find(frame.ns.name);
    if (it == namespaces_.end()) return false;
    conn = it->second;
    relayed = relayed_names_.contains(frame.ns.name);
    // Before `opened` the sandbox has not been told of this host: nothing
    // may precede `opened`, and the event had no listening host.
    if (conn->opened_owed()) return !relayed;
  }
  conn->SendNamespaceEvent(frame);
  return !relayed;
}

void DirectConns::OnNamespaceRelayed(const std::string& name) {
  absl::MutexLock lock(&mu_);
  relayed_names_.insert(name);
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
  if (conn->session() != nullptr) conn->session()->Detach(conn.get());
  absl::MutexLock lock(&mu_);
  closed_.emplace_back(conn->number(), conn->why());
  conns_.erase(fd);
  if (!conn->ns_name().empty()) {
    auto it = namespaces_.find(conn->ns_name());
    if (it != namespaces_.end() && it->second == conn) {
      namespaces_.erase(it);
      relayed_names_.erase(conn->ns_name());
    }
  }
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
    if (conns_.empty() && sessions_.empty()) {
      looked_count_ = -1;  // a kept look is this Drive's, served or not
      waited_count_.store(-1, std::memory_order_relaxed);
      return;
    }
    for (auto& [fd, conn] : conns_) all.push_back(conn);
    for (auto& [client, session] : sessions_) sessions.push_back(session);
  }
  // A look LookReady kept is this Drive's; none: look now.
  epoll_event own[kMaxEvents];
  const epoll_event* events = looked_;
  int n = looked_count_;
  looked_count_ = -1;
  if (n < 0) {
    events = own;
    n = ::epoll_wait(epoll_fd_.get(), own, kMaxEvents, 0);
    own_looks_.fetch_add(1, std::memory_order_relaxed);
  }
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

int DirectConns::WaitReady(int timeout_ms) {
  // A look kept from an earlier wait that nobody used is dropped first:
  // the poll side never reads events this wait is writing.
  waited_count_.store(-1, std::memory_order_relaxed);
  const int n = ::epoll_wait(epoll_fd_.get(), waited_, kMaxEvents, timeout_ms);
  if (n > 0) waited_count_.store(n, std::memory_order_release);
  return n;
}

void DirectConns::WakeWaiter() { WriteWake(wake_fd_.get()); }

bool DirectConns::LookReady() {
  const int waited = waited_count_.exchange(-1, std::memory_order_acquire);
  {
    absl::MutexLock lock(&mu_);
    if (conns_.empty() && sessions_.empty()) return true;
  }
  int n = waited;
  if (n > 0) {
    std::copy(waited_, waited_ + n, looked_);
  } else {
    n = ::epoll_wait(epoll_fd_.get(), looked_, kMaxEvents, 0);
    own_looks_.fetch_add(1, std::memory_order_relaxed);
  }
  if (n < 0) {
    looked_count_ = -1;  // Drive looks again; the link is read as before
    return true;
  }
  looked_count_ = n;
  for (int i = 0; i < n; ++i) {
    if (looked_[i].data.fd == link_fd_) return true;
  }
  return false;
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
      if (conn->session() == session && conn->half_closed()) {
        conns.push_back(conn);
      }
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
    if (sessions_.size() == 1) owner = sessions_.begin()->second;
  }
  if (owner != nullptr) {  // one client, the common case: one lookup
    if (!owner->HandleCallOutput(frames)) return false;
    FinishHalfClosed(owner.get());
    return true;
  }
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
