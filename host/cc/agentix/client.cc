#include "agentix/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agentix/calls_cpu.h"
#include "agentix/calls_transport.h"
#include "agentix/frame_transport.h"
#include "agentix/grpc_calls_transport.h"
#include "agentix/runtime/v1/runtime.grpc.pb.h"

namespace agentix {
namespace pb = ::agentix::runtime::v1;

namespace {

// Arguments travel in pieces of this size (runtime.proto's ArgumentChunk).
constexpr size_t kChunkBytes = 1 << 20;
constexpr char kRemoteErrorUrl[] =
    "type.googleapis.com/agentix.runtime.v1.RemoteError";

absl::Status StatusFromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

// A failed call as a Status: the RemoteError's canonical code, "type:
// message", and the whole RemoteError as a payload for GetRemoteError.
absl::Status StatusFromRemoteError(const pb::RemoteError& error) {
  absl::StatusCode code = static_cast<absl::StatusCode>(error.code());
  if (error.code() <= 0 || error.code() > 16) code = absl::StatusCode::kUnknown;
  absl::Status status(code, absl::StrCat(error.type(), ": ", error.message()));
  status.SetPayload(kRemoteErrorUrl, absl::Cord(error.SerializeAsString()));
  return status;
}

// `prefix` and `n` as 16 hex digits (StrFormat took ~1 % of a noop's CPU).
std::string CallId(const std::string& prefix, uint64_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(prefix.size() + 16, '0');
  std::memcpy(id.data(), prefix.data(), prefix.size());
  for (size_t i = id.size(); n != 0; n >>= 4) id[--i] = kHex[n & 0xf];
  return id;
}

std::string RandomHex(size_t nbytes) {
  std::random_device device;
  std::string out;
  for (size_t i = 0; i < nbytes; ++i) {
    absl::StrAppendFormat(&out, "%02x", device() & 0xff);
  }
  return out;
}

SpanAttributes TextAttributes(
    const google::protobuf::RepeatedPtrField<pb::Attribute>& attributes) {
  SpanAttributes out;
  out.reserve(attributes.size());
  for (const pb::Attribute& attribute : attributes) {
    const pb::AttributeValue& value = attribute.value();
    std::string text;
    switch (value.value_case()) {
      case pb::AttributeValue::kStringValue: text = value.string_value(); break;
      case pb::AttributeValue::kBoolValue: text = value.bool_value() ? "true" : "false"; break;
      case pb::AttributeValue::kIntValue: text = absl::StrCat(value.int_value()); break;
      case pb::AttributeValue::kDoubleValue: text = absl::StrCat(value.double_value()); break;
      case pb::AttributeValue::kBytesValue: text = value.bytes_value(); break;
      default: break;
    }
    out.emplace_back(attribute.key(), std::move(text));
  }
  return out;
}

// Settles options->calls_wire: kAuto takes $AGENTIX_CALLS_WIRE; a target
// that is not unix:// (or TLS) gets gRPC, or INVALID_ARGUMENT when the
// frame wire is required.
absl::Status ResolveCallsWire(ConnectOptions* options) {
  if (options->calls_wire == CallsWire::kAuto) {
    const char* env = std::getenv("AGENTIX_CALLS_WIRE");
    const absl::string_view mode = env == nullptr ? "" : env;
    if (mode == "frames") {
      options->calls_wire = CallsWire::kFrames;
    } else if (mode == "grpc") {
      options->calls_wire = CallsWire::kGrpc;
    } else if (!mode.empty() && mode != "auto") {
      return absl::InvalidArgumentError(absl::StrCat(
          "AGENTIX_CALLS_WIRE=", mode, " is not one of auto, frames, grpc"));
    }
  }
  // A bad $AGENTIX_CALLS_SPIN_US is an error here, not a silent gRPC stream.
  if (absl::Status spin = client_internal::CallsSpinFromEnv().status(); !spin.ok()) {
    return spin;
  }
  const bool unix_target = !client_internal::CallsSocketPath(options->target).empty();
  if (unix_target && !options->tls.has_value()) return absl::OkStatus();
  if (options->calls_wire == CallsWire::kFrames) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calls_wire is frames, but the frame wire needs a unix:// target without TLS (target ",
        options->target, options->tls.has_value() ? ", TLS on)" : ")"));
  }
  options->calls_wire = CallsWire::kGrpc;
  return absl::OkStatus();
}

}  // namespace

std::optional<RemoteError> GetRemoteError(const absl::Status& status) {
  auto payload = status.GetPayload(kRemoteErrorUrl);
  if (!payload.has_value()) return std::nullopt;
  pb::RemoteError proto;
  if (!proto.ParseFromString(std::string(*payload))) return std::nullopt;
  RemoteError error;
  error.type = proto.type();
  error.message = proto.message();
  error.traceback = proto.traceback();
  error.cancelled = proto.cancelled();
  if (proto.has_returncode()) error.returncode = proto.returncode();
  error.type_module = proto.type_module();
  error.type_qualname = proto.type_qualname();
  return error;
}

absl::StatusOr<std::string> Arguments::Encode() const {
  if (!error_.ok()) return error_;
  // The headers (at most 11 bytes) are packed straight into the result; the
  // values are copied once (a 16 MiB argument is not copied twice).
  MsgpackBuffer out;
  out.reserve(11 + positional_.size() + keywords_.size());  // small: inline
  msgpack::packer<MsgpackBuffer> packer(out);
  packer.pack_array(2);
  packer.pack_array(static_cast<uint32_t>(npositional_));
  out.write(positional_.data(), positional_.size());
  packer.pack_map(static_cast<uint32_t>(nkeywords_));
  out.write(keywords_.data(), keywords_.size());
  return out.Release();
}

namespace client_internal {

// One call's state; guarded by Connection::mu_ once registered.
struct Call {
  std::string id;
  std::string callable;
  std::string arguments;  // kept until the end: resent after a reconnect
  uint32_t stream_window = 0;
  absl::Time deadline = absl::InfiniteFuture();
  // StartCall's plain context fields (CallOptions); kept for a resend.
  std::string traceparent;
  std::string tracestate;
  std::map<std::string, std::string> baggage;
  bool streaming = false;
  // A caller blocks in Wait() for this call: it may read the stream itself
  // (Connection::Wait), so the background reader need not.
  bool in_wait = false;

  bool done = false;  // the terminal event arrived (or the call was failed)
  bool abandoned = false;  // the caller left; ignore what still comes
  bool cancel_requested = false;
  absl::Status status;
  std::string result;  // ResultChunks + the CallResult's value
  // The ResultChunks' bytes as they came, joined into `result` once the
  // CallResult ends them (JoinResult).
  std::vector<std::string> result_chunks;
  uint64_t log_seq = 0;
  uint64_t trace_seq = 0;
  // Streaming calls (null for others: an empty std::deque allocates).
  std::unique_ptr<std::deque<std::string>> items;
  uint64_t next_index = 0;  // the next item index expected (drops replays)
  uint64_t consumed = 0;    // items handed to the consumer
  uint64_t acked = 0;       // the last StreamAck's next_index
  absl::CondVar changed;
  // The caller's thread, pinned while it waits for this call alone
  // ($AGENTIX_CALLS_CPU; Connection::pinned_).
  ThreadPin pin;
  // While its starter's PinTrial times it (Connection::timed_): when it
  // started, and on which thread.
  absl::Time lone_at;
  std::thread::id timed_by;
};

// One Calls stream (on gRPC or the frame wire). Writers hold write_mu; the
// reader marks it dead (after cancelling it) before Finish, so no Write
// races Finish.
struct CallsStream {
  std::unique_ptr<CallsTransport> transport;
  absl::Mutex write_mu;
  bool dead = false;
  const absl::Time opened = absl::Now();
  std::atomic<bool> delivered{false};  // a message arrived on it

  bool Write(const pb::CallsRequest& request) {
    absl::MutexLock lock(&write_mu);
    if (dead) return false;
    return transport->Write(request);
  }
};

// A Calls stream that ended with one of these is refused, not broken:
// resuming would be refused again, so its calls fail with it.
bool IsRefusal(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnauthenticated ||
         status.code() == absl::StatusCode::kPermissionDenied ||
         status.code() == absl::StatusCode::kInvalidArgument;
}

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  explicit Connection(ConnectOptions options)
      : options_(std::move(options)),
        id_prefix_(RandomHex(8)) {
    if (options_.client_id.empty()) options_.client_id = RandomHex(16);
  }

  absl::Status Start() {
    absl::StatusOr<int> calls_cpu = CallsCpuFromEnv();
    if (!calls_cpu.ok()) return calls_cpu.status();
    calls_cpu_ = *calls_cpu;
    follow_daemon_ = calls_cpu_ >= 0 && CallsCpuFollowsDaemon();
    absl::StatusOr<bool> direct = CallsDirectFromEnv();
    if (!direct.ok()) return direct.status();
    direct_calls_ = *direct;
    absl::Status status = Open();
    if (!status.ok()) return status;
    reader_ = std::thread([this] { ReaderLoop(); });
    return absl::OkStatus();
  }

  void Close() {
    std::shared_ptr<CallsStream> stream;
    {
      absl::MutexLock lock(&mu_);
      if (closing_) return;
      closing_ = true;
      stream = stream_;
      for (auto& [id, call] : pending_) {
        if (!call->done) {
          call->done = true;
          call->status = absl::CancelledError("the client was closed");
          call->changed.SignalAll();
        }
      }
      wake_.SignalAll();
    }
    if (stream != nullptr) {
      // Cancel what is still running in the sandbox before leaving.
      pb::CallsRequest request;
      {
        absl::MutexLock lock(&mu_);
        for (auto& [id, call] : pending_) {
          request.add_events()->mutable_cancel()->set_call_id(id);
        }
      }
      if (request.events_size() > 0) stream->Write(request);
      stream->transport->Cancel();
    }
    if (reader_.joinable()) reader_.join();
  }

  const ConnectOptions& options() const { return options_; }

  StreamMetadata Metadata() const {
    StreamMetadata metadata;
    if (!options_.token.empty()) {
      metadata.emplace_back("authorization", "Bearer " + options_.token);
    }
    metadata.emplace_back("agentix-client-id", options_.client_id);
    return metadata;
  }

  void AddMetadata(grpc::ClientContext* context) const {
    for (const auto& [key, value] : Metadata()) context->AddMetadata(key, value);
  }

  CallsWire wire() {
    absl::MutexLock lock(&mu_);
    return wire_;
  }

  std::shared_ptr<pb::RuntimeService::Stub> stub() {
    absl::MutexLock lock(&mu_);
    return stub_;
  }

  bool closing() {
    absl::MutexLock lock(&mu_);
    return closing_;
  }

  int reconnects() {
    absl::MutexLock lock(&mu_);
    return reconnects_;
  }

  // Registers and sends a new call.
  absl::StatusOr<std::shared_ptr<Call>> StartCall(absl::string_view callable,
                                                  std::string arguments,
                                                  const CallOptions& options,
                                                  bool streaming, bool will_wait) {
    auto call = std::make_shared<Call>();
    call->callable = std::string(callable);
    call->arguments = std::move(arguments);
    call->stream_window = streaming ? std::max<uint32_t>(options.stream_window, 1) : 0;
    call->traceparent = options.traceparent;
    call->tracestate = options.tracestate;
    call->baggage = options.baggage;
    call->streaming = streaming;
    if (streaming) call->items = std::make_unique<std::deque<std::string>>();
    call->in_wait = will_wait;
    if (options.timeout != absl::InfiniteDuration()) {
      call->deadline = absl::Now() + options.timeout;
    }
    std::shared_ptr<CallsStream> stream;
    std::vector<std::string> acks;
    {
      absl::MutexLock lock(&mu_);
      if (closing_) return absl::FailedPreconditionError("the client is closed");
      call->id = CallId(id_prefix_, ++next_call_);
      pending_[call->id] = call;
      // Pinned only on the frame wire: on gRPC's, gRPC's own threads read
      // the result, and a pinned caller would only crowd the daemon's CPU.
      if (calls_cpu_ >= 0) {
        PlaceWaitLocked(call.get(), will_wait && !streaming && wire_ == CallsWire::kFrames);
      }
      stream = stream_;
      if (stream == nullptr) {
        wake_.SignalAll();  // the reader reconnects, then sends it
        return call;
      }
      acks.swap(pending_acks_);
      // The background reader reads for calls nobody waits on yet; a caller
      // that goes on to Wait() may take the read over (Connection::Wait).
      // An idle background reader also learns there is traffic (acks).
      const bool needs_reader = !will_wait || streaming || call->deadline != absl::InfiniteFuture();
      if ((needs_reader && !reading_) || reader_asleep_) {
        reader_asleep_ = false;
        wake_.SignalAll();
      }
    }
    SendCall(stream.get(), *call, &acks);
    return call;
  }

  // Blocks for the call's terminal event (and, with subscriptions open, for
  // the log records and spans it emitted before it).
  // A caller whose call has no deadline reads the Calls stream itself when
  // nobody else does, so its result needs no hand-off from another thread;
  // it dispatches whatever else arrives meanwhile. (A call with a deadline
  // waits, as a blocking Read could not time out.)
  absl::StatusOr<std::string> Wait(const std::shared_ptr<Call>& call) {
    absl::MutexLock lock(&mu_);
    call->in_wait = true;
    const bool may_read = call->deadline == absl::InfiniteFuture();
    while (!call->done) {
      if (may_read && !reading_ && stream_ != nullptr && !closing_) {
        ReadOneLocked(stream_, call.get());
        continue;
      }
      if (call->changed.WaitWithDeadline(&mu_, call->deadline) && !call->done) {
        call->in_wait = false;
        UnpinLocked(call.get());
        EndTimedLocked(call.get(), /*waited=*/false);
        return TimeOutLocked(call);
      }
    }
    call->in_wait = false;
    UnpinLocked(call.get());
    EndTimedLocked(call.get(), /*waited=*/true);
    AwaitSideChannelsLocked(*call);
    if (!call->status.ok()) return call->status;
    return std::move(call->result);
  }

  absl::StatusOr<std::optional<std::string>> Next(const std::shared_ptr<Call>& call,
                                                  std::string* result) {
    std::optional<std::string> item;
    uint64_t ack = 0;
    std::shared_ptr<CallsStream> stream;
    {
      absl::MutexLock lock(&mu_);
      std::deque<std::string>& items = *call->items;
      while (items.empty() && !call->done) {
        if (call->changed.WaitWithDeadline(&mu_, call->deadline) &&
            items.empty() && !call->done) {
          return TimeOutLocked(call);
        }
      }
      if (items.empty()) {
        if (!call->status.ok()) return call->status;
        *result = std::move(call->result);
        return std::optional<std::string>();
      }
      item = std::move(items.front());
      items.pop_front();
      ++call->consumed;
      // Acknowledge in batches of half a window: the sandbox never waits
      // for an ack while the consumer still has items to take.
      const uint64_t batch = std::max<uint64_t>(call->stream_window / 2, 1);
      if (!call->done && call->consumed - call->acked >= batch) {
        call->acked = ack = call->consumed;
        stream = stream_;
      }
    }
    if (stream != nullptr) {
      pb::CallsRequest request;
      pb::StreamAck* stream_ack = request.add_events()->mutable_stream_ack();
      stream_ack->set_call_id(call->id);
      stream_ack->set_next_index(ack);
      stream->Write(request);
    }
    return item;
  }

  void Cancel(const std::shared_ptr<Call>& call) {
    std::shared_ptr<CallsStream> stream;
    {
      absl::MutexLock lock(&mu_);
      if (call->done) return;
      call->cancel_requested = true;
      stream = stream_;
    }
    if (stream != nullptr) SendCancel(stream.get(), call->id);
  }

  // The caller dropped an unfinished call: cancel it and forget it (its
  // terminal event, when it comes, is only acknowledged).
  void Abandon(const std::shared_ptr<Call>& call) {
    std::shared_ptr<CallsStream> stream;
    {
      absl::MutexLock lock(&mu_);
      call->abandoned = true;
      UnpinLocked(call.get());
      EndTimedLocked(call.get(), /*waited=*/false);
      if (call->done) return;
      pending_.erase(call->id);
      stream = stream_;
    }
    if (stream != nullptr) SendCancel(stream.get(), call->id);
  }

  // Side channels (log/trace subscriptions) report what they handled.
  void SideChannelOpened(bool logs, int delta) {
    absl::MutexLock lock(&mu_);
    (logs ? log_subscriptions_ : trace_subscriptions_) += delta;
    barrier_.SignalAll();
  }
  void SideChannelHandled(bool logs, uint64_t seq) {
    absl::MutexLock lock(&mu_);
    uint64_t& handled = logs ? handled_log_seq_ : handled_trace_seq_;
    handled = std::max(handled, seq);
    barrier_.SignalAll();
  }

 private:
  std::shared_ptr<grpc::Channel> NewChannel() const {
    grpc::ChannelArguments args;
    // A fresh channel must not inherit a broken one's reconnect backoff.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    if (options_.tls.has_value()) {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = options_.tls->root_certs;
      ssl.pem_cert_chain = options_.tls->cert_chain;
      ssl.pem_private_key = options_.tls->private_key;
      credentials = grpc::SslCredentials(ssl);
      if (!options_.tls->server_name.empty()) {
        args.SetSslTargetNameOverride(options_.tls->server_name);
      }
    } else {
      credentials = grpc::InsecureChannelCredentials();
    }
    return grpc::CreateCustomChannel(options_.target, credentials, args);
  }

  // A new channel, checked with GetInfo, and a Calls stream on it.
  absl::Status Open() {
    std::shared_ptr<grpc::Channel> channel = NewChannel();
    auto stub = std::make_shared<pb::RuntimeService::Stub>(channel);
    {
      grpc::ClientContext context;
      AddMetadata(&context);
      context.set_deadline(absl::ToChronoTime(absl::Now() + options_.connect_timeout));
      pb::GetInfoResponse info;
      grpc::Status status = stub->GetInfo(&context, pb::GetInfoRequest(), &info);
      if (!status.ok()) {
        absl::Status error = StatusFromGrpc(status);
        return absl::Status(error.code(),
                            absl::StrCat("cannot reach agentix-sandboxd at ",
                                         options_.target, ": ", error.message()));
      }
    }
    auto stream = std::make_shared<CallsStream>();
    absl::Status frames = OpenFrames(stream.get());
    if (!frames.ok()) return frames;
    if (stream->transport == nullptr) {
      stream->transport = OpenGrpcCallsTransport(stub.get(), Metadata());
    }
    absl::MutexLock lock(&mu_);
    wire_ = std::strcmp(stream->transport->wire(), "frames") == 0 ? CallsWire::kFrames
                                                                 : CallsWire::kGrpc;
    channel_ = std::move(channel);
    stub_ = std::move(stub);
    stream_ = std::move(stream);
    return absl::OkStatus();
  }

  // The Calls stream on the frame wire when the options allow and PATH.calls
  // answers (options_.calls_wire is kAuto or kFrames only for a unix://
  // target without TLS: Client::Connect). kAuto falls back to gRPC (left
  // null) when it does not; kFrames fails.
  absl::Status OpenFrames(CallsStream* stream) {
    if (options_.calls_wire == CallsWire::kGrpc) return absl::OkStatus();
    StreamMetadata metadata = Metadata();
    // Served by the worker if the daemon hands the socket over: two fewer
    // hand-offs a call (the daemon's connection thread and worker link).
    if (direct_calls_) metadata.emplace_back(kCallsDirectKey, "1");
    if (calls_cpu_ >= 0) metadata.emplace_back(kCallsCpuKey, absl::StrCat(calls_cpu_));
    CallsCpuAnswer on_calls_cpu;
    if (follow_daemon_) {  // a --calls_cpu=probe daemon says whether pinning pays
      // (and says it again whenever a re-probe changes its answer)
      metadata.emplace_back(kCallsCpuFollowKey, kCallsCpuFollowChanges);
      on_calls_cpu = [this](absl::string_view told) {
        told_off_.store(told == "off", std::memory_order_relaxed);
      };
    }
    absl::StatusOr<std::unique_ptr<CallsTransport>> transport =
        ConnectFrameTransport(CallsSocketPath(options_.target), metadata,
                              std::move(on_calls_cpu));
    if (transport.ok()) {
      stream->transport = *std::move(transport);
      return absl::OkStatus();
    }
    if (options_.calls_wire == CallsWire::kAuto) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(
        "calls_wire is frames, but ", transport.status().message(),
        " (is agentix-sandboxd running with --calls_socket?)"));
  }

  // Pinned waits: a call alone in flight that its caller waits for without
  // a deadline (the caller then reads its result itself) pins the caller's
  // thread to calls_cpu_ now, before it is written; a second call in flight
  // unpins the thread pinned (overlapping calls run anywhere). With the
  // default setting the thread's PinTrial says whether a lone call waits
  // pinned, and times it while a trial runs (not while the thread's
  // PinBudget rests: its calls could not wait pinned).
  void PlaceWaitLocked(Call* call, bool waited) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (pending_.size() == 1 && waited && call->deadline == absl::InfiniteFuture()) {
      if (told_off_.load(std::memory_order_relaxed)) return;
      bool pin = true;
      if (follow_daemon_ && !ThreadPinBudget().RestsNow()) {
        PinTrial& trial = ThreadPinTrial();
        const absl::Time now = absl::Now();
        trial.Begin(now);
        pin = trial.PinsNow();
        if (trial.running()) {
          timed_ = call;
          call->lone_at = now;
          call->timed_by = std::this_thread::get_id();
        }
      }
      if (pin && call->pin.Pin(calls_cpu_)) {
        pinned_ = call;
      } else if (pin && timed_ == call) {
        timed_ = nullptr;  // it was to wait pinned and could not: not timed
      }
    } else {
      timed_ = nullptr;  // calls overlap: none is a lone call
      if (pinned_ != nullptr) UnpinLocked(pinned_);
    }
  }

  // `call` is over for its caller: the trial gets its time if it was the
  // one timed and its caller (the thread whose trial it is) `waited` for
  // its end — not after a time-out, an abandon, or a daemon's "off" meanwhile.
  void EndTimedLocked(Call* call, bool waited) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (timed_ != call) return;
    timed_ = nullptr;
    if (!waited || call->timed_by != std::this_thread::get_id() ||
        told_off_.load(std::memory_order_relaxed)) {
      return;
    }
    const absl::Time now = absl::Now();
    ThreadPinTrial().End(now - call->lone_at, now);
  }

  // Gives the thread `call` pinned its mask back (its caller is leaving).
  void UnpinLocked(Call* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (pinned_ != call) return;
    call->pin.Unpin();
    pinned_ = nullptr;
  }

  absl::Status TimeOutLocked(const std::shared_ptr<Call>& call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    call->done = true;
    call->status = absl::DeadlineExceededError(
        absl::StrCat("call ", call->id, " (", call->callable,
                     ") outlived its deadline; the sandbox was told to cancel it"));
    call->abandoned = true;
    pending_.erase(call->id);
    std::shared_ptr<CallsStream> stream = stream_;
    if (stream != nullptr) {
      mu_.Unlock();
      SendCancel(stream.get(), call->id);
      mu_.Lock();
    }
    return call->status;
  }

  void AwaitSideChannelsLocked(const Call& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (log_subscriptions_ == 0 && trace_subscriptions_ == 0) return;
    const absl::Time until = absl::Now() + options_.connect_timeout;
    while ((log_subscriptions_ > 0 && handled_log_seq_ < call.log_seq) ||
           (trace_subscriptions_ > 0 && handled_trace_seq_ < call.trace_seq)) {
      if (barrier_.WaitWithDeadline(&mu_, until)) break;
    }
  }

  void SendCancel(CallsStream* stream, const std::string& id) {
    pb::CallsRequest request;
    request.add_events()->mutable_cancel()->set_call_id(id);
    stream->Write(request);
  }

  // StartCall with the first piece of the arguments, then ArgumentChunks
  // with offsets (so a resend after a reconnect is idempotent). False when
  // the stream broke meanwhile: the reconnect sends the call again.
  bool SendCall(CallsStream* stream, const Call& call,
                std::vector<std::string>* acks) {
    pb::CallsRequest request;
    if (acks != nullptr) {
      for (std::string& id : *acks) {
        request.add_events()->mutable_ack()->set_call_id(std::move(id));
      }
    }
    pb::StartCall* start = request.add_events()->mutable_start();
    start->set_call_id(call.id);
    start->set_callable(call.callable);
    start->set_encoding(pb::ENCODING_MSGPACK);
    const size_t total = call.arguments.size();
    const size_t first = std::min(total, kChunkBytes);
    start->set_arguments(call.arguments.data(), first);
    start->set_arguments_size(total);
    start->set_stream_window(call.stream_window);
    if (!call.traceparent.empty()) start->set_traceparent(call.traceparent);
    if (!call.tracestate.empty()) start->set_tracestate(call.tracestate);
    if (!call.baggage.empty()) {
      start->mutable_baggage()->insert(call.baggage.begin(), call.baggage.end());
    }
    if (!stream->Write(request)) return false;
    for (size_t offset = first; offset < total; offset += kChunkBytes) {
      pb::CallsRequest chunk_request;
      pb::ArgumentChunk* chunk = chunk_request.add_events()->mutable_argument_chunk();
      chunk->set_call_id(call.id);
      chunk->set_offset(offset);
      chunk->set_data(call.arguments.data() + offset,
                      std::min(kChunkBytes, total - offset));
      if (!stream->Write(chunk_request)) return false;
    }
    return true;
  }

  // Whether a pending call needs the background reader: one nobody waits
  // on in Wait() (Start() not yet waited, streams) or one with a deadline.
  bool NeedsBackgroundReaderLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [id, call] : pending_) {
      if (!call->in_wait || call->streaming || call->deadline != absl::InfiniteFuture()) {
        return true;
      }
    }
    return false;
  }

  // The read is free: passes it to the background reader or to one caller
  // blocked in Wait() (not `except`, which is leaving).
  void HandOffReadLocked(const Call* except) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reading_ || stream_ == nullptr) return;
    if (NeedsBackgroundReaderLocked()) {
      reader_asleep_ = false;
      wake_.SignalAll();
      return;
    }
    for (const auto& [id, call] : pending_) {
      if (call.get() != except && call->in_wait && !call->done) {
        call->changed.SignalAll();
        return;
      }
    }
  }

  // Reads one message of `stream` (with mu_ released) and dispatches it.
  // `self`: the waiting call of the reading caller (null: the background
  // reader). A broken stream goes to the background reader to finish and
  // reconnect.
  void ReadOneLocked(std::shared_ptr<CallsStream> stream, const Call* self)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    reading_ = true;
    mu_.Unlock();
    const bool ok = stream->transport->Read(&response_);
    if (ok) {
      // A stream that delivers something counts as a working connection:
      // the next break gets the full reconnect budget again.
      stream->delivered = true;
    } else {
      stream->transport->Cancel();
      absl::MutexLock lock(&stream->write_mu);
      stream->dead = true;
    }
    mu_.Lock();
    reading_ = false;
    if (ok) {
      DispatchLocked(&response_);
    } else {
      if (stream_ == stream) stream_ = nullptr;
      broken_ = std::move(stream);
      reader_asleep_ = false;
      wake_.SignalAll();
      return;
    }
    if (self == nullptr || self->done) HandOffReadLocked(self);
  }

  // The background reader: reads while a call needs it (see Wait), finishes
  // broken streams and reconnects, and sends acks that no StartCall carried.
  void ReaderLoop() {
    for (;;) {
      std::shared_ptr<CallsStream> broken;
      bool reconnect = false;
      {
        absl::MutexLock lock(&mu_);
        for (;;) {
          if (closing_) break;
          if (broken_ != nullptr) {
            broken = std::move(broken_);
            break;
          }
          if (stream_ == nullptr) {
            reconnect = true;
            break;
          }
          if (!reading_ && NeedsBackgroundReaderLocked()) {
            ReadOneLocked(stream_, nullptr);
            continue;
          }
          if (!pending_acks_.empty() || !pending_.empty()) {
            // Acks ride on the next StartCall; those still here after a
            // few milliseconds go out on their own.
            const bool had_acks = !pending_acks_.empty();
            wake_.WaitWithTimeout(&mu_, absl::Milliseconds(5));
            if (had_acks && !pending_acks_.empty() && stream_ != nullptr) {
              std::shared_ptr<CallsStream> stream = stream_;
              mu_.Unlock();
              FlushAcks(stream.get());
              mu_.Lock();
            }
          } else {
            reader_asleep_ = true;
            wake_.Wait(&mu_);
          }
        }
        if (closing_) break;
      }
      if (broken != nullptr) {
        const absl::Status ended = broken->transport->Finish();
        // A stream that broke before delivering anything (say, on a message
        // over the receive limit that a resume would only replay) uses up
        // one reconnect attempt, so such loops end. A stream that lived a
        // while was a working connection too.
        if (broken->delivered || absl::Now() - broken->opened > absl::Seconds(2)) {
          failures_ = 0;
        } else {
          ++failures_;
        }
        absl::MutexLock lock(&mu_);
        last_error_ = ended;
        if (IsRefusal(ended)) FailPendingLocked(ended);
        continue;
      }
      if (reconnect) {
        Reconnect();
        // Callers in Wait() may read the new stream (also when Resume
        // found it broken again: a read must notice).
        absl::MutexLock lock(&mu_);
        HandOffReadLocked(nullptr);
      }
    }
    // Closing: wait out a caller's Read (the context is cancelled), then
    // finish the streams nobody finished.
    std::vector<std::shared_ptr<CallsStream>> left;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](bool* reading) { return !*reading; }, &reading_));
      if (broken_ != nullptr) left.push_back(std::move(broken_));
      if (stream_ != nullptr) left.push_back(std::move(stream_));
    }
    for (const auto& stream : left) {
      stream->transport->Cancel();
      {
        absl::MutexLock lock(&stream->write_mu);
        stream->dead = true;
      }
      stream->transport->Finish().IgnoreError();
    }
  }

  // The call's value: its chunks and the CallResult's `last` bytes in one
  // string of their exact size, allocated once. Appending 1 MiB chunks to
  // a string doubled it at each step, and past glibc's mmap threshold: a
  // 16 MiB value cost a fresh 32 MiB mapping, 4,096 page faults (~13 us
  // each on this project's VM), every call. A value without chunks is
  // taken as it is.
  static void JoinResult(Call* call, std::string* last) {
    if (call->result_chunks.empty()) {
      call->result.swap(*last);
      return;
    }
    size_t size = last->size();
    for (const std::string& chunk : call->result_chunks) size += chunk.size();
    call->result.reserve(size);
    for (const std::string& chunk : call->result_chunks) call->result.append(chunk);
    call->result.append(*last);
    std::vector<std::string>().swap(call->result_chunks);
  }

  // Takes the bytes of `response`'s results and items (it is read into
  // again next).
  void DispatchLocked(pb::CallsResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    {
      for (pb::SandboxEvent& event : *response->mutable_events()) {
        switch (event.kind_case()) {
          case pb::SandboxEvent::kResultChunk: {
            Call* call = Find(event.result_chunk().call_id());
            if (call != nullptr) {
              call->result_chunks.emplace_back().swap(
                  *event.mutable_result_chunk()->mutable_data());
            }
            break;
          }
          case pb::SandboxEvent::kResult: {
            pb::CallResult& result = *event.mutable_result();
            Call* call = Find(result.call_id());
            if (call == nullptr) {
              pending_acks_.push_back(result.call_id());
              break;
            }
            JoinResult(call, result.mutable_value());
            call->log_seq = result.log_seq();
            call->trace_seq = result.trace_seq();
            Finish(call, absl::OkStatus());
            break;
          }
          case pb::SandboxEvent::kError: {
            const pb::CallError& error = event.error();
            Call* call = Find(error.call_id());
            if (call == nullptr) {
              if (!error.call_id().empty()) pending_acks_.push_back(error.call_id());
              break;
            }
            call->log_seq = error.log_seq();
            call->trace_seq = error.trace_seq();
            Finish(call, StatusFromRemoteError(error.error()));
            break;
          }
          case pb::SandboxEvent::kStreamItem: {
            pb::StreamItem& item = *event.mutable_stream_item();
            Call* call = Find(item.call_id());
            // Items replayed after a resume arrive again: keep each once.
            if (call == nullptr || call->items == nullptr ||
                item.index() != call->next_index) {
              break;
            }
            ++call->next_index;
            call->items->push_back(std::move(*item.mutable_value()));
            call->changed.SignalAll();
            break;
          }
          default:
            break;
        }
      }
    }
  }

  Call* Find(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = pending_.find(id);
    return it == pending_.end() ? nullptr : it->second.get();
  }

  // Ends a pending call on its terminal event, which is to be acked: the
  // map's key (the id) moves to pending_acks_.
  void Finish(Call* call, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    call->done = true;
    call->status = std::move(status);
    call->changed.SignalAll();
    auto node = pending_.extract(call->id);  // may free `call`
    pending_acks_.push_back(std::move(node.key()));
  }

  // Acknowledges the terminal events just received (a caller's next
  // StartCall may already have carried them).
  void FlushAcks(CallsStream* stream) {
    std::vector<std::string> acks;
    {
      absl::MutexLock lock(&mu_);
      acks.swap(pending_acks_);
    }
    if (acks.empty()) return;
    pb::CallsRequest request;
    for (std::string& id : acks) {
      request.add_events()->mutable_ack()->set_call_id(std::move(id));
    }
    stream->Write(request);
  }

  // Re-establishes the channel and Calls stream and resumes every pending
  // call on it: StartCall again (the daemon runs an id at most once and
  // refuses to re-run a finished one), ResumeCalls, the consumed position
  // of streams and pending cancels. When every attempt fails, the pending
  // calls fail with UNAVAILABLE and the reader waits for a new call.
  void Reconnect() {
    {
      absl::MutexLock lock(&mu_);
      if (pending_.empty()) {
        // Nothing to resume: reconnect when a call needs the stream.
        while (pending_.empty() && !closing_) wake_.Wait(&mu_);
        if (closing_) return;
        failures_ = 0;
      }
    }
    while (failures_ < options_.reconnect_attempts) {
      if (failures_ > 0) {
        absl::Duration delay = options_.reconnect_delay;
        for (int i = 1; i < failures_ && delay < options_.reconnect_delay_max; ++i) delay *= 2;
        absl::MutexLock lock(&mu_);
        wake_.WaitWithTimeout(&mu_, std::min(delay, options_.reconnect_delay_max));
        if (closing_) return;
      }
      absl::Status opened = Open();
      if (opened.ok()) {
        Resume();
        return;
      }
      ++failures_;
      absl::MutexLock lock(&mu_);
      last_error_ = opened;
      // A wrong token stays wrong (say, the daemon restarted with another).
      if (opened.code() == absl::StatusCode::kUnauthenticated ||
          opened.code() == absl::StatusCode::kPermissionDenied) {
        failures_ = 0;
        FailPendingLocked(opened);
        return;
      }
    }
    failures_ = 0;
    absl::MutexLock lock(&mu_);
    const std::string reason = absl::StrCat(
        "lost the connection to agentix-sandboxd at ", options_.target,
        " and could not resume (", options_.reconnect_attempts,
        " attempts); last: ", last_error_.ToString());
    for (auto& [id, call] : pending_) {
      call->done = true;
      call->status = absl::UnavailableError(reason);
      call->changed.SignalAll();
    }
    pending_.clear();
  }

  // Fails every pending call with the daemon's refusal.
  void FailPendingLocked(const absl::Status& refusal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& [id, call] : pending_) {
      call->done = true;
      call->status = refusal;
      call->changed.SignalAll();
    }
    pending_.clear();
  }

  void Resume() {
    std::vector<std::shared_ptr<Call>> calls;
    std::shared_ptr<CallsStream> stream;
    std::vector<std::string> acks;
    {
      absl::MutexLock lock(&mu_);
      ++reconnects_;
      stream = stream_;
      acks.swap(pending_acks_);
      for (auto& [id, call] : pending_) {
        call->result.clear();  // the daemon replays chunks from the start
        call->result_chunks.clear();
        calls.push_back(call);
      }
    }
    if (stream == nullptr) return;
    pb::CallsRequest tail;
    pb::ResumeCalls* resume = tail.add_events()->mutable_resume();
    for (const auto& call : calls) {
      if (!SendCall(stream.get(), *call, &acks)) return;  // broke again
      acks.clear();
      resume->add_call_ids(call->id);
    }
    for (std::string& id : acks) tail.add_events()->mutable_ack()->set_call_id(id);
    absl::MutexLock lock(&mu_);
    for (const auto& call : calls) {
      if (call->stream_window > 0 && call->acked > 0) {
        pb::StreamAck* ack = tail.add_events()->mutable_stream_ack();
        ack->set_call_id(call->id);
        ack->set_next_index(call->acked);
      }
      if (call->cancel_requested) {
        tail.add_events()->mutable_cancel()->set_call_id(call->id);
      }
    }
    mu_.Unlock();
    stream->Write(tail);
    mu_.Lock();
  }

  ConnectOptions options_;
  const std::string id_prefix_;
  std::thread reader_;

  absl::Mutex mu_;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_call_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<pb::RuntimeService::Stub> stub_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<CallsStream> stream_ ABSL_GUARDED_BY(mu_);  // null: down
  absl::flat_hash_map<std::string, std::shared_ptr<Call>> pending_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::string> pending_acks_ ABSL_GUARDED_BY(mu_);
  // $AGENTIX_CALLS_CPU's CPU (-1: off), and the call whose caller's thread
  // is pinned to it (PlaceWaitLocked).
  int calls_cpu_ = -1;
  bool direct_calls_ = true;  // $AGENTIX_CALLS_DIRECT (CallsDirectFromEnv)
  bool follow_daemon_ = false;  // $AGENTIX_CALLS_CPU unset: ask the daemon
  std::atomic<bool> told_off_{false};  // a --calls_cpu=probe daemon said "off"
  Call* pinned_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The lone call its starter's PinTrial times (PlaceWaitLocked), or null.
  Call* timed_ ABSL_GUARDED_BY(mu_) = nullptr;
  // A thread is in Read() on the Calls stream (the read "token"); only it
  // uses response_.
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  pb::CallsResponse response_;
  // A stream whose Read failed, for the background reader to Finish.
  std::shared_ptr<CallsStream> broken_ ABSL_GUARDED_BY(mu_);
  // The background reader waits without a timeout (nothing pending).
  bool reader_asleep_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar wake_;  // closing, or a call waits for a connection
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  int reconnects_ ABSL_GUARDED_BY(mu_) = 0;
  CallsWire wire_ ABSL_GUARDED_BY(mu_) = CallsWire::kGrpc;
  int failures_ = 0;  // the reader thread's: failed attempts in a row
  // Side-channel barrier (see Client::SubscribeLogs).
  absl::CondVar barrier_;
  int log_subscriptions_ ABSL_GUARDED_BY(mu_) = 0;
  int trace_subscriptions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t handled_log_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t handled_trace_seq_ ABSL_GUARDED_BY(mu_) = 0;
};

// A Logs or Traces subscription: its own thread reads, hands records to
// the callback in seq order, acks them, and resubscribes from the last seq
// after a break.
template <bool kLogs>
class SideSubscription final : public Subscription {
 public:
  using Request = std::conditional_t<kLogs, pb::LogsRequest, pb::TracesRequest>;
  using Response = std::conditional_t<kLogs, pb::LogsResponse, pb::TracesResponse>;
  using Item = std::conditional_t<kLogs, LogRecord, SpanEvent>;

  SideSubscription(std::shared_ptr<Connection> connection,
                   std::function<void(const Item&)> callback, uint64_t after_seq)
      : connection_(std::move(connection)),
        callback_(std::move(callback)),
        last_seq_(after_seq) {}

  // Opens the first stream (so its subscription is in place on return).
  absl::Status Start() {
    absl::Status status = OpenStream();
    if (!status.ok()) return status;
    connection_->SideChannelOpened(kLogs, 1);
    thread_ = std::thread([this] { Run(); });
    return absl::OkStatus();
  }

  ~SideSubscription() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      if (context_ != nullptr) context_->TryCancel();
      wake_.SignalAll();
    }
    if (thread_.joinable()) thread_.join();
    if (started_) connection_->SideChannelOpened(kLogs, -1);
  }

  uint64_t last_seq() const override { return last_seq_.load(); }

 private:
  absl::Status OpenStream() {
    auto context = std::make_shared<grpc::ClientContext>();
    connection_->AddMetadata(context.get());
    std::shared_ptr<pb::RuntimeService::Stub> stub = connection_->stub();
    std::unique_ptr<grpc::ClientReaderWriter<Request, Response>> rw;
    if constexpr (kLogs) {
      rw = stub->Logs(context.get());
    } else {
      rw = stub->Traces(context.get());
    }
    Request request;
    auto* subscribe = request.mutable_subscribe();
    subscribe->set_after_seq(last_seq_.load());
    subscribe->set_instance_id(instance_id_);
    if (!rw->Write(request)) {
      return StatusFromGrpc(rw->Finish());
    }
    absl::MutexLock lock(&mu_);
    if (stopping_) context->TryCancel();
    context_ = std::move(context);
    rw_ = std::move(rw);
    started_ = true;
    return absl::OkStatus();
  }

  void Run() {
    absl::Duration delay = absl::Milliseconds(100);
    for (;;) {
      if (rw_ != nullptr) {
        Response response;
        while (rw_->Read(&response)) {
          Handle(response);
          delay = absl::Milliseconds(100);
        }
        rw_->Finish();
        rw_.reset();
      }
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        wake_.WaitWithTimeout(&mu_, delay);
        if (stopping_) return;
      }
      delay = std::min(delay * 2, absl::Seconds(2));
      if (!OpenStream().ok()) rw_.reset();
    }
  }

  void Handle(const Response& response) {
    if (!response.instance_id().empty() && response.instance_id() != instance_id_) {
      // A restarted daemon counts seqs from 1 again.
      if (!instance_id_.empty()) last_seq_ = 0;
      instance_id_ = response.instance_id();
    }
    uint64_t last = last_seq_.load();
    if constexpr (kLogs) {
      for (const pb::LogRecord& record : response.records()) {
        if (record.seq() <= last) continue;
        LogRecord item;
        item.seq = record.seq();
        item.logger = record.logger();
        item.level = record.level();
        item.level_name = record.level_name();
        item.message = record.message();
        item.time_unix_nanos = record.time_unix_nanos();
        item.call_id = record.call_id();
        item.exception_text = record.exception_text();
        item.origin = record.origin();
        item.extras = record.extras();
        callback_(item);
        last = record.seq();
      }
    } else {
      for (const pb::TraceEvent& event : response.events()) {
        if (event.seq() <= last) continue;
        SpanEvent item;
        item.seq = event.seq();
        item.kind = event.kind();
        item.trace_id = event.agentix_trace_id();
        item.span_id = event.agentix_span_id();
        item.parent_id = event.agentix_parent_id();
        item.name = event.name();
        item.status = event.status();
        item.error_message = event.error_message();
        item.call_id = event.call_id();
        item.attributes = TextAttributes(event.attributes());
        for (const pb::SpanEventRecord& record : event.events()) {
          item.events.push_back({record.name(), record.time_unix_nanos(),
                                 TextAttributes(record.attributes())});
        }
        callback_(item);
        last = event.seq();
      }
    }
    last_seq_ = last;
    connection_->SideChannelHandled(kLogs, last);
    Request ack;
    ack.mutable_ack()->set_seq(last);
    rw_->Write(ack);
  }

  std::shared_ptr<Connection> connection_;
  std::function<void(const Item&)> callback_;
  std::atomic<uint64_t> last_seq_;
  std::string instance_id_;  // the reader thread's
  std::unique_ptr<grpc::ClientReaderWriter<Request, Response>> rw_;
  std::thread thread_;
  bool started_ = false;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<grpc::ClientContext> context_ ABSL_GUARDED_BY(mu_);
  absl::CondVar wake_;
};

}  // namespace client_internal

using client_internal::Connection;

// ---------------------------------------------------------------- Call

Call::Call(std::shared_ptr<Connection> connection,
           std::shared_ptr<client_internal::Call> call)
    : connection_(std::move(connection)), call_(std::move(call)) {}
Call::Call(Call&&) noexcept = default;
Call& Call::operator=(Call&& other) noexcept {
  if (this != &other) {
    if (call_ != nullptr) connection_->Abandon(call_);
    connection_ = std::move(other.connection_);
    call_ = std::move(other.call_);
  }
  return *this;
}
Call::~Call() {
  if (call_ != nullptr) connection_->Abandon(call_);
}
absl::StatusOr<std::string> Call::Wait() {
  if (call_ == nullptr) return absl::FailedPreconditionError("no call");
  return connection_->Wait(call_);
}
void Call::Cancel() {
  if (call_ != nullptr) connection_->Cancel(call_);
}
const std::string& Call::id() const { return call_->id; }

// ---------------------------------------------------------------- Stream

Stream::Stream(std::shared_ptr<Connection> connection,
               std::shared_ptr<client_internal::Call> call)
    : connection_(std::move(connection)), call_(std::move(call)) {}
Stream::Stream(Stream&&) noexcept = default;
Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (call_ != nullptr) connection_->Abandon(call_);
    connection_ = std::move(other.connection_);
    call_ = std::move(other.call_);
    result_ = std::move(other.result_);
  }
  return *this;
}
Stream::~Stream() {
  if (call_ != nullptr) connection_->Abandon(call_);
}
absl::StatusOr<std::optional<std::string>> Stream::Next() {
  if (call_ == nullptr) return absl::FailedPreconditionError("no stream");
  return connection_->Next(call_, &result_);
}
const std::string& Stream::Result() const { return result_; }
void Stream::Cancel() {
  if (call_ != nullptr) connection_->Cancel(call_);
}

// ---------------------------------------------------------------- Client

Client::Client(std::shared_ptr<Connection> connection)
    : connection_(std::move(connection)) {}

Client::~Client() { connection_->Close(); }

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ConnectOptions options) {
  if (options.target.empty()) {
    return absl::InvalidArgumentError("ConnectOptions.target is empty");
  }
  if (options.client_id.size() > 256) {
    return absl::InvalidArgumentError("ConnectOptions.client_id is over 256 bytes");
  }
  absl::Status wire = ResolveCallsWire(&options);
  if (!wire.ok()) return wire;
  auto connection = std::make_shared<Connection>(std::move(options));
  absl::Status status = connection->Start();
  if (!status.ok()) return status;
  return std::unique_ptr<Client>(new Client(std::move(connection)));
}

absl::StatusOr<Call> Client::Start(absl::string_view callable,
                                   const Arguments& args,
                                   const CallOptions& options) {
  absl::StatusOr<std::string> encoded = args.Encode();
  if (!encoded.ok()) return encoded.status();
  return StartEncoded(callable, *std::move(encoded), options);
}

absl::StatusOr<Call> Client::StartEncoded(absl::string_view callable,
                                          std::string arguments,
                                          const CallOptions& options) {
  auto call = connection_->StartCall(callable, std::move(arguments), options,
                                     /*streaming=*/false, /*will_wait=*/false);
  if (!call.ok()) return call.status();
  return Call(connection_, *std::move(call));
}

absl::StatusOr<Call> Client::StartWaited(absl::string_view callable,
                                         const Arguments& args,
                                         const CallOptions& options) {
  absl::StatusOr<std::string> encoded = args.Encode();
  if (!encoded.ok()) return encoded.status();
  auto call = connection_->StartCall(callable, *std::move(encoded), options,
                                     /*streaming=*/false, /*will_wait=*/true);
  if (!call.ok()) return call.status();
  return Call(connection_, *std::move(call));
}

absl::StatusOr<Stream> Client::StartStream(absl::string_view callable,
                                           const Arguments& args,
                                           const CallOptions& options) {
  absl::StatusOr<std::string> encoded = args.Encode();
  if (!encoded.ok()) return encoded.status();
  auto call = connection_->StartCall(callable, *std::move(encoded), options,
                                     /*streaming=*/true, /*will_wait=*/false);
  if (!call.ok()) return call.status();
  return Stream(connection_, *std::move(call));
}

absl::StatusOr<std::unique_ptr<Subscription>> Client::SubscribeLogs(
    std::function<void(const LogRecord&)> on_record, uint64_t after_seq) {
  auto subscription = std::make_unique<client_internal::SideSubscription<true>>(
      connection_, std::move(on_record), after_seq);
  absl::Status status = subscription->Start();
  if (!status.ok()) return status;
  return std::unique_ptr<Subscription>(std::move(subscription));
}

absl::StatusOr<std::unique_ptr<Subscription>> Client::SubscribeSpans(
    std::function<void(const SpanEvent&)> on_event, uint64_t after_seq) {
  auto subscription = std::make_unique<client_internal::SideSubscription<false>>(
      connection_, std::move(on_event), after_seq);
  absl::Status status = subscription->Start();
  if (!status.ok()) return status;
  return std::unique_ptr<Subscription>(std::move(subscription));
}

int Client::reconnects() const { return connection_->reconnects(); }

CallsWire Client::calls_wire() const { return connection_->wire(); }

}  // namespace agentix
