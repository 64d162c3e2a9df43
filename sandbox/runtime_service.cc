#include "sandbox/runtime_service.h"

#include <chrono>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/grpc_status.h"
#include "base/log.h"
#include "sandbox/batching_writer.h"
#include "sandbox/namespace_stream.h"
#include "sandbox/side_record.h"

// A SideResponse serialized straight into one slice, as gRPC's protobuf
// serializer does for a message.
template <typename Record>
class grpc::SerializationTraits<agentix::sandbox::SideResponse<Record>, void> {
 public:
  static grpc::Status Serialize(
      const agentix::sandbox::SideResponse<Record>& response,
      grpc::ByteBuffer* buffer, bool* own_buffer) {
    *own_buffer = true;
    grpc_slice slice = grpc_slice_malloc(response.ByteSizeLong());
    response.SerializeTo(reinterpret_cast<char*>(GRPC_SLICE_START_PTR(slice)));
    grpc::Slice owned(slice, grpc::Slice::STEAL_REF);
    *buffer = grpc::ByteBuffer(&owned, 1);
    return grpc::Status::OK;
  }
};

namespace agentix::sandbox {
namespace {

using runtime::v1::CallsRequest;
using runtime::v1::CallsResponse;
using runtime::v1::LogsRequest;
using runtime::v1::LogsResponse;

class CallsReactor;

// The `agentix-client-id` metadata of a call: which host client (one
// RuntimeClient) a stream belongs to, so that the records of its calls go
// to it alone. Ids longer than kMaxCallIdBytes are ignored (not stored).
std::string ClientIdOf(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("agentix-client-id");
  if (it == metadata.end() || it->second.size() > kMaxCallIdBytes) return "";
  return std::string(it->second.data(), it->second.size());
}

struct CallsEvents : RepeatedMessageField<CallsEvents> {
  static auto* Get(CallsResponse& r) { return r.mutable_events(); }
};
using CallsWriter = BatchingWriter<CallsRequest, CallsResponse,
                                   runtime::v1::SandboxEvent, CallsEvents>;

// The CallSink of one Calls stream. Outlives its reactor while the session
// manager still holds it. A half-closed stream finishes once every call it
// owns has reached its terminal event.
class StreamSink final : public CallSink, public CallsWriter {
 public:
  StreamSink(CallsReactor* reactor, SessionManager* manager);
  bool Deliver(std::vector<SandboxEventPtr> events) override;
  // The last result may have been in hand when a write completed.
  void OnDelivered() override { MaybeFinish(); }
  size_t UnwrittenBytes() override { return QueuedBytes(); }
  void Abort(const std::string& message) override {
    Fail(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, message));
  }
  const std::string& client_id() const override { return client_id_; }
  // Once, in OnStart, before any event of the stream is handled.
  void SetClientId(std::string id) { client_id_ = std::move(id); }

 private:
  // Lock order is writer -> manager; the manager never calls a sink while
  // holding its own lock.
  bool ReadyToFinish() override { return !manager_->HasOpenCalls(this); }
  void OnBacklogCleared() override;

  CallsReactor* const reactor_;
  SessionManager* const manager_;
  std::string client_id_;
};

// A host that stops reading its results must not make the daemon buffer
// without bound: past this many unwritten bytes the stream's reads pause
// (no new calls or chunks are taken from it) until the backlog drains.
constexpr size_t kPauseReadsAboveBytes = 64u << 20;

class CallsReactor final : public ServerStream<CallsRequest, CallsResponse> {
 public:
  explicit CallsReactor(SessionManager* manager)
      : manager_(manager), sink_(std::make_shared<StreamSink>(this, manager)) {
    manager_->RegisterSink(sink_);
  }

  // The write backlog drained: take host events again.
  void ResumeReads() { StartRead(&request_); }

 private:
  void OnStart() override {
    sink_->SetClientId(ClientIdOf(server_context()));
    // A client whose direct session the worker holds is served here only
    // once that session is the daemon's (docs/DIRECT-CALLS.md, collapse).
    // The completion queue's thread waits: a few ms, at most the bound.
    const absl::Status collapsed = manager_->CollapseDirect(
        sink_->client_id(), manager_->options().direct_collapse_timeout);
    if (!collapsed.ok()) {
      sink_->Fail(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               std::string(collapsed.message())));
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      sink_->OnReadsDone();
      return;
    }
    manager_->HandleHostEvents(sink_, request_.events());
    request_.Clear();
    if (sink_->PauseReadsIfBacklogged(kPauseReadsAboveBytes)) return;
    StartRead(&request_);
  }

  // As any malformed event (the Calls contract): a BadRequest CallError,
  // and the stream stays open.
  void OnBadMessage(const std::string& error) override {
    sink_->Deliver({MakeCallError(
        "", "BadRequest",
        "unparseable CallsRequest message (" + error + "); it was ignored",
        absl::StatusCode::kInvalidArgument)});
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override { sink_->OnWriteDone(ok); }
  void OnCancel() override { sink_->OnCancel(); }

  void OnDone() override {
    sink_->Detach();
    manager_->DetachSink(sink_.get());
    manager_->ReleaseMemorySoon();
    delete this;
  }

  SessionManager* const manager_;
  std::shared_ptr<StreamSink> sink_;
  CallsRequest request_;
};

StreamSink::StreamSink(CallsReactor* reactor, SessionManager* manager)
    : CallsWriter(reactor), reactor_(reactor), manager_(manager) {
  ShareQueuedBytes(manager->unwritten_result_bytes());
}

void StreamSink::OnBacklogCleared() { reactor_->ResumeReads(); }

bool StreamSink::Deliver(std::vector<SandboxEventPtr> events) {
  // A half-closed stream re-checks ReadyToFinish when this write completes.
  return Enqueue(std::move(events));
}

// The write side of a Logs or Traces stream: a subscriber of the side
// channel's buffer whose responses all carry the daemon's instance id. A
// host that falls kSideChannelMaxUnwrittenBytes behind is paused, not ended:
// the buffer keeps its records and catches it up once it has read most of
// what waits for it (SeqBuffer::Subscriber::Deliver). One that reads
// nothing for the paused-subscriber timeout is ended and unsubscribed
// (its place freed); its client's next stream gets what it had not.
template <typename Request, typename Response, typename Record, typename Field>
class SideChannelSink final
    : public SeqBuffer<Record>::Subscriber,
      public BatchingWriter<Request, Response, Record, Field>,
      public Flushable,
      public std::enable_shared_from_this<
          SideChannelSink<Request, Response, Record, Field>> {
  using Writer = BatchingWriter<Request, Response, Record, Field>;

 public:
  // `buffer` must outlive the stream.
  SideChannelSink(ServerStream<Request, Response>* reactor,
                  SeqBuffer<Record>* buffer)
      : Writer(reactor, Header(buffer->instance_id())), buffer_(buffer) {}
  // Ends the stream when it stays paused with nothing read for `timeout`,
  // checked on `scheduler`'s thread (which must outlive the stream). `what`
  // names the stream for messages ("Logs"). Once, right after construction.
  void EndPausedAfter(absl::Duration timeout, FlushScheduler* scheduler,
                      const char* what) {
    timeout_ = timeout;
    what_ = what;
    pause_check_ = std::make_shared<PauseCheck>(this->shared_from_this());
    std::weak_ptr<Flushable> check = pause_check_;
    this->WatchBacklogStall(
        {absl::ToChronoNanoseconds(timeout),
         [scheduler, check](FlushScheduler::Clock::time_point when) {
           scheduler->FlushAt(when, check);
         }});
  }
  // Turns on coalescing, its delayed writes run by `scheduler` (which must
  // outlive the stream). Once, right after construction.
  void CoalesceWith(FlushScheduler* scheduler) {
    std::weak_ptr<Flushable> self = this->shared_from_this();
    this->SetCoalescing(
        {kSideChannelCoalesceDelay, kSideChannelCoalesceBytes,
         [scheduler, self](FlushScheduler::Clock::time_point when) {
           scheduler->FlushAt(when, self);
         },
         kSideChannelCoalesceMaxDelay});
  }
  bool Deliver(std::vector<std::shared_ptr<const Record>> records) override {
    // An ended stream takes nothing either, but is not paused: it is about
    // to unsubscribe.
    return this->Offer(std::move(records), kSideChannelMaxUnwrittenBytes) !=
           Writer::Offered::kBacklogged;
  }
  void Flush() override { this->WriteHeldBack(); }
  void FlushNow() override { this->WriteNow(); }
  const std::string& client_id() const override { return client_id_; }
  // Once, before subscribing.
  void SetClientId(std::string id) { client_id_ = std::move(id); }

 private:
  static Response Header(const std::string& instance_id) {
    Response header;
    header.instance_id = instance_id;
    return header;
  }
  // The host has read most of its backlog: the buffer sends what it kept
  // meanwhile.
  void OnBacklogCleared() override { buffer_->Resume(this->shared_from_this()); }

  // The paused-subscriber check, run by the flush scheduler.
  class PauseCheck final : public Flushable {
   public:
    explicit PauseCheck(std::weak_ptr<SideChannelSink> sink)
        : sink_(std::move(sink)) {}
    void Flush() override {
      if (auto sink = sink_.lock()) sink->EndIfPausedTooLong();
    }

   private:
    const std::weak_ptr<SideChannelSink> sink_;
  };

  void EndIfPausedTooLong() {
    const std::string timeout = absl::FormatDuration(timeout_);
    if (!this->EndIfBacklogStalled(
            FlushScheduler::Clock::now(),
            grpc::Status(
                grpc::StatusCode::RESOURCE_EXHAUSTED,
                absl::StrCat(
                    "this host read nothing of its ", what_, " stream for ",
                    timeout, " while more than ",
                    kSideChannelMaxUnwrittenBytes >> 20,
                    " MiB waited for it (--paused-subscriber-timeout-s): the "
                    "daemon ended the stream to free its subscriber place. "
                    "What it had not received stays in the daemon's buffer: "
                    "subscribe again with after_seq (the agentix host does "
                    "so at its next call) to get it, with a drop report for "
                    "what the buffer evicted meanwhile")))) {
      return;
    }
    buffer_->Unsubscribe(this);
    AGX_LOG(Warning,
            "a {} subscriber (client \"{}\") read nothing for {} while "
            "paused {} MiB behind: its stream is ended (RESOURCE_EXHAUSTED) "
            "and its place freed; its records stay buffered",
            what_, client_id_, timeout, kSideChannelMaxUnwrittenBytes >> 20);
  }

  SeqBuffer<Record>* const buffer_;
  std::string client_id_;
  absl::Duration timeout_;
  const char* what_ = "";
  std::shared_ptr<PauseCheck> pause_check_;
};

// One Logs or Traces stream: subscribes to the buffer on the first
// subscribe request (later ones are ignored), forwards acks, finishes when
// the host half-closes.
template <typename Request, typename Response, typename Record, typename Field>
class SideChannelReactor final : public ServerStream<Request, Response> {
 public:
  using Sink = SideChannelSink<Request, Response, Record, Field>;

  SideChannelReactor(SessionManager* manager, SeqBuffer<Record>* buffer,
                     FlushScheduler* scheduler, const char* what)
      : manager_(manager),
        buffer_(buffer),
        sink_(std::make_shared<Sink>(this, buffer)) {
    sink_->CoalesceWith(scheduler);
    sink_->EndPausedAfter(manager->options().paused_subscriber_timeout,
                          scheduler, what);
    sink_->SetMaxBatchBytes(kSideChannelMaxBatchBytes);
  }

 private:
  void OnStart() override { this->StartRead(&request_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      sink_->OnReadsDone();
      return;
    }
    if (request_.has_subscribe()) {
      if (!subscribed_) {
        subscribed_ = true;
        sink_->SetClientId(ClientIdOf(this->server_context()));
        absl::Status subscribed =
            buffer_->Subscribe(sink_, request_.subscribe().after_seq(),
                               request_.subscribe().instance_id());
        if (!subscribed.ok()) {
          sink_->Fail(base::ToGrpcStatus(subscribed));
          return;
        }
      }
    } else if (request_.has_ack()) {
      buffer_->Ack(request_.ack().seq(), sink_->client_id());
    }
    request_.Clear();
    this->StartRead(&request_);
  }

  void OnBadMessage(const std::string& error) override {
    sink_->Fail(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        std::string("unparseable ") + Request::descriptor()->name() +
            " message (" + error + ")"));
  }

  void OnWriteDone(bool ok) override { sink_->OnWriteDone(ok); }
  void OnCancel() override { sink_->OnCancel(); }

  void OnDone() override {
    buffer_->Unsubscribe(sink_.get());
    sink_->Detach();
    manager_->ReleaseMemorySoon();
    delete this;
  }

  SessionManager* const manager_;
  SeqBuffer<Record>* const buffer_;
  std::shared_ptr<Sink> sink_;
  Request request_;
  bool subscribed_ = false;  // only touched by read reactions
};

// Logs and Traces responses are SideResponses borrowing the buffered
// records (side_record.h): the same bytes as LogsResponse / TracesResponse.
template <typename Record>
struct SideRecords {
  static void Borrow(SideResponse<Record>& response, const Record* record) {
    response.records.push_back(record);
  }
  static void GiveBack(SideResponse<Record>& response) {
    response.records.clear();
  }
  static size_t ItemBytes(const Record& record) { return record.ByteSize(); }
  static size_t CachedItemBytes(const Record& record) {
    return record.ByteSize();  // a few additions: not worth a cache
  }
};
using LogsReactor = SideChannelReactor<LogsRequest, LogsResponseWire,
                                       LogRecordWire, SideRecords<LogRecordWire>>;
using TracesReactor =
    SideChannelReactor<runtime::v1::TracesRequest, TracesResponseWire,
                       TraceEventWire, SideRecords<TraceEventWire>>;

struct NamespaceEvents : RepeatedMessageField<NamespaceEvents> {
  static auto* Get(runtime::v1::NamespaceResponse& r) {
    return r.mutable_events();
  }
};

// The write side of one Namespace stream on gRPC.
class NamespaceSink final
    : public NamespaceStreamSink,
      public BatchingWriter<runtime::v1::NamespaceRequest,
                            runtime::v1::NamespaceResponse,
                            runtime::v1::NamespaceEvent, NamespaceEvents> {
 public:
  using BatchingWriter::BatchingWriter;
  bool Deliver(std::vector<NamespaceEventPtr> events) override {
    return Enqueue(std::move(events));
  }
  void HoldUntilOpened(runtime::v1::NamespaceResponse header) override {
    SetHeader(std::move(header));
    HoldUntilFirst();
  }
  void WriteOpened(runtime::v1::NamespaceResponse opened) override {
    WriteFirst(std::move(opened));
  }
  void Fail(const absl::Status& status) override {
    BatchingWriter::Fail(base::ToGrpcStatus(status));
  }
};

// One Namespace stream on gRPC: the reactions hand each message to the
// stream's transport-independent logic (namespace_stream.h).
class NamespaceReactor final
    : public ServerStream<runtime::v1::NamespaceRequest,
                          runtime::v1::NamespaceResponse> {
 public:
  explicit NamespaceReactor(SessionManager* manager)
      : sink_(std::make_shared<NamespaceSink>(this)), stream_(manager, sink_) {}

 private:
  void OnStart() override { StartRead(&request_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      sink_->OnReadsDone();
      return;
    }
    if (!stream_.Handle(request_)) return;
    request_.Clear();
    StartRead(&request_);
  }

  void OnBadMessage(const std::string& error) override {
    stream_.BadMessage(error);
  }

  void OnWriteDone(bool ok) override { sink_->OnWriteDone(ok); }
  void OnCancel() override { sink_->OnCancel(); }

  void OnDone() override {
    stream_.Close();
    sink_->Detach();
    delete this;
  }

  std::shared_ptr<NamespaceSink> sink_;
  NamespaceStream stream_;
  runtime::v1::NamespaceRequest request_;
};

using AsyncService = RuntimeServiceImpl::Service;

// A streaming method's RequestX of the generated service.
template <typename Stream>
using RequestMethod = void (AsyncService::*)(grpc::ServerContext*,
                                             typename Stream::Stream*,
                                             grpc::CompletionQueue*,
                                             grpc::ServerCompletionQueue*,
                                             void*);

// Awaits the next call of `method` with a stream from `make()` and, once
// that call arrives, the one after.
template <typename Stream, typename Make>
void AwaitNext(AsyncService* service, RequestMethod<Stream> method,
               CompletionQueueThread* thread, StreamActivity* activity,
               Make make) {
  Stream* stream = make();
  stream->CountIn(activity);
  stream->AwaitCall(
      [service, method](grpc::ServerContext* context,
                        typename Stream::Stream* call,
                        grpc::ServerCompletionQueue* queue, void* tag) {
        (service->*method)(context, call, queue, queue, tag);
      },
      thread, [service, method, thread, activity, make] {
        AwaitNext<Stream>(service, method, thread, activity, make);
      });
}

}  // namespace

RuntimeServiceImpl::RuntimeServiceImpl(SessionManager* manager,
                                       std::string version,
                                       StreamActivity* activity)
    : manager_(manager), version_(std::move(version)), activity_(activity) {}

void RuntimeServiceImpl::Start(CompletionQueueThread* thread) {
  AsyncService* service = &service_;
  SessionManager* manager = manager_;
  FlushScheduler* scheduler = &flush_scheduler_;

  AwaitNext<CallsReactor>(service, &AsyncService::RequestCalls, thread, activity_,
                          [manager] { return new CallsReactor(manager); });
  AwaitNext<LogsReactor>(service, &AsyncService::RequestLogs, thread, activity_,
                         [manager, scheduler] {
                           return new LogsReactor(manager, &manager->logs(),
                                                  scheduler, "Logs");
                         });
  AwaitNext<TracesReactor>(
      service, &AsyncService::RequestTraces, thread, activity_, [manager, scheduler] {
        return new TracesReactor(manager, &manager->traces(), scheduler,
                                 "Traces");
      });
  AwaitNext<NamespaceReactor>(
      service, &AsyncService::RequestNamespace, thread, activity_,
      [manager] { return new NamespaceReactor(manager); });
  const std::string* version = &version_;
  UnaryCall<runtime::v1::GetInfoRequest, runtime::v1::GetInfoResponse>::
      AwaitNext(
          [service](auto* context, auto* request, auto* writer, auto* queue,
                    void* tag) {
            service->RequestGetInfo(context, request, writer, queue, queue,
                                    tag);
          },
          [manager, version](const runtime::v1::GetInfoRequest& /*request*/,
                             runtime::v1::GetInfoResponse* response) {
            SessionInfo info = manager->Info();
            response->set_status("ok");
            response->set_version(*version);
            response->set_worker_pid(info.worker_pid);
            response->set_workers_started(info.workers_started);
            response->set_calls_in_flight(info.calls_in_flight);
            response->set_calls_queued(info.calls_queued);
            response->set_namespace_streams(info.namespace_streams);
            return grpc::Status::OK;
          },
          thread);
}

}  // namespace agentix::sandbox
