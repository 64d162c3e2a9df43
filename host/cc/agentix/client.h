// The C++ client of agentix-sandboxd: runs Python callables inside a sandbox
// over RuntimeService (proto/agentix/runtime/v1/runtime.proto) with
// msgpack-encoded values.
//
//   auto client = agentix::Client::Connect({.target = "unix:///run/agentix.sock"});
//   absl::StatusOr<int64_t> sum =
//       (*client)->Remote<int64_t>("mypkg.tools::add", 2, 3);
//
// Nothing in this API throws: failures are absl::Status values. A call that
// failed in the sandbox carries the sandbox's RemoteError (GetRemoteError).
// One Client holds one gRPC channel and one Calls stream for every call (on
// a unix:// target, over the daemon's frame wire when it has one); it is
// thread-safe. If the connection breaks, calls in flight are resumed on a
// new one: each runs once, and its result is delivered once (see README.md).
#ifndef AGENTIX_HOST_CC_AGENTIX_CLIENT_H_
#define AGENTIX_HOST_CC_AGENTIX_CLIENT_H_

#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "msgpack.hpp"

namespace agentix {

// The buffer the client packs values into. Its own type so that its packer
// can write every double as a msgpack float64: msgpack-cxx's pack_double
// writes a whole value (2.0) as an integer, and the sandbox would then see
// an int where the caller passed a float. A std::string underneath: small
// arguments stay inline (msgpack::sbuffer mallocs 8 KiB up front).
class MsgpackBuffer {
 public:
  void write(const char* data, size_t size) { bytes_.append(data, size); }
  const char* data() const { return bytes_.data(); }
  size_t size() const { return bytes_.size(); }
  void clear() { bytes_.clear(); }
  void reserve(size_t size) { bytes_.reserve(size); }
  const std::string& str() const { return bytes_; }
  std::string Release() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

}  // namespace agentix

namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(v1) {
template <>
inline packer<agentix::MsgpackBuffer>& packer<agentix::MsgpackBuffer>::pack_double(double d) {
  uint64_t bits;
  static_assert(sizeof bits == sizeof d);
  std::memcpy(&bits, &d, sizeof d);
  char buf[9];
  buf[0] = static_cast<char>(0xcbu);
  for (int i = 8; i >= 1; --i, bits >>= 8) buf[i] = static_cast<char>(bits & 0xffu);
  append_buffer(buf, 9);
  return *this;
}
}  // MSGPACK_API_VERSION_NAMESPACE(v1)
}  // namespace msgpack

namespace agentix {

struct TlsOptions {
  // PEM roots that sign the daemon's certificate; empty: the system roots.
  std::string root_certs;
  // For mutual TLS (the daemon's --tls-client-ca): this client's chain and key.
  std::string cert_chain;
  std::string private_key;
  // Overrides the name checked against the certificate (tests, IP targets).
  std::string server_name;
};

// Which wire carries the Calls stream (the calls themselves; subscriptions,
// GetInfo and everything else stay on gRPC). docs/FRAME-WIRE.md.
enum class CallsWire {
  // $AGENTIX_CALLS_WIRE when set ("auto", "frames", "grpc"); otherwise the
  // frame wire when the target is unix://PATH without TLS and PATH.calls
  // accepts a connection, else gRPC. Decided again at each reconnect.
  kAuto,
  // The frame wire, or an error: INVALID_ARGUMENT from Connect for a target
  // that is not unix:// or with TLS; UNAVAILABLE when PATH.calls cannot be
  // connected.
  kFrames,
  // gRPC always.
  kGrpc,
};

struct ConnectOptions {
  // "unix:///path/to.sock", "unix:relative.sock" or "host:port".
  std::string target;
  // The daemon's bearer token (its --token-file / $AGENTIX_TOKEN), or empty.
  std::string token;
  // Set: connect with TLS.
  std::optional<TlsOptions> tls;
  // Names this client to the daemon (agentix-client-id metadata, at most 256
  // bytes): log records and spans of its calls go to its subscriptions.
  // Empty: a random id.
  std::string client_id;
  // Bound on connecting (the GetInfo probe), on each reconnect attempt, and
  // on waiting for a subscription's side channel (log/trace barrier).
  absl::Duration connect_timeout = absl::Seconds(10);
  // After the Calls stream breaks with calls in flight: this many reconnect
  // attempts (0 = none: they fail with UNAVAILABLE), the first at once, then
  // after reconnect_delay doubling up to reconnect_delay_max.
  int reconnect_attempts = 8;
  absl::Duration reconnect_delay = absl::Milliseconds(250);
  absl::Duration reconnect_delay_max = absl::Seconds(5);
  CallsWire calls_wire = CallsWire::kAuto;
};

// Why a call failed in the sandbox (runtime.proto's RemoteError).
struct RemoteError {
  // The exception class ("ValueError") or a runtime type ("Cancelled",
  // "WorkerDied", "ResultUnavailable", ...).
  std::string type;
  std::string message;
  std::string traceback;
  bool cancelled = false;
  std::optional<int32_t> returncode;
  std::string type_module;
  std::string type_qualname;
};

// The RemoteError a call's status carries, if it failed in the sandbox
// (rather than in the client or the connection).
std::optional<RemoteError> GetRemoteError(const absl::Status& status);

// Positional and keyword arguments, msgpack-encoded as `[args, kwargs]`.
class Arguments {
 public:
  Arguments() = default;
  template <typename... A>
  explicit Arguments(const A&... args) {
    (Add(args), ...);
  }
  template <typename T>
  Arguments& Add(const T& value) {
    return Append(&positional_, value, &npositional_);
  }
  template <typename T>
  Arguments& Kw(absl::string_view name, const T& value) {
    msgpack::packer<MsgpackBuffer> packer(keywords_);
    packer.pack_str(static_cast<uint32_t>(name.size()));
    packer.pack_str_body(name.data(), static_cast<uint32_t>(name.size()));
    ++nkeywords_;
    return Append(&keywords_, value, nullptr);
  }
  // The encoded `[args, kwargs]`; a value msgpack-cxx cannot pack is an
  // INVALID_ARGUMENT.
  absl::StatusOr<std::string> Encode() const;

 private:
  template <typename T>
  Arguments& Append(MsgpackBuffer* buffer, const T& value, size_t* count) {
    try {
      msgpack::pack(*buffer, value);
    } catch (const std::exception& error) {
      error_ = absl::InvalidArgumentError(
          std::string("argument cannot be msgpack-encoded: ") + error.what());
    }
    if (count != nullptr) ++*count;
    return *this;
  }

  MsgpackBuffer positional_;
  MsgpackBuffer keywords_;
  size_t npositional_ = 0;
  size_t nkeywords_ = 0;
  absl::Status error_;
};

namespace client_internal {
// The first zone chunk of a decode: a small result needs no 8 KiB block
// (msgpack-cxx's default); larger ones grow it.
constexpr size_t kDecodeZoneChunk = 512;
inline bool ReferenceInput(msgpack::type::object_type, size_t, void*) { return true; }
}  // namespace client_internal

// Decodes msgpack bytes into T (msgpack-cxx's conversions; a msgpack::
// object_handle keeps any value). A mismatch is INVALID_ARGUMENT.
template <typename T>
absl::StatusOr<T> Decode(absl::string_view bytes) {
  try {
    if constexpr (std::is_same_v<T, msgpack::object_handle>) {
      auto zone = std::make_unique<msgpack::zone>(client_internal::kDecodeZoneChunk);
      msgpack::object object = msgpack::unpack(*zone, bytes.data(), bytes.size());
      return msgpack::object_handle(object, std::move(zone));
    } else {
      // T copies what it keeps, so strings and bins are read in place from
      // `bytes` rather than copied into the zone first (a 16 MiB result is
      // copied once, not twice).
      msgpack::zone zone(client_internal::kDecodeZoneChunk);
      msgpack::object object = msgpack::unpack(zone, bytes.data(), bytes.size(),
                                               &client_internal::ReferenceInput);
      return object.as<T>();
    }
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(
        std::string("result does not decode as the requested type: ") +
        error.what());
  }
}

struct CallOptions {
  // The call fails with DEADLINE_EXCEEDED after this long and the sandbox is
  // told to cancel it. Infinite: no deadline.
  absl::Duration timeout = absl::InfiniteDuration();
  // Streaming calls: items the sandbox may produce ahead of the consumer.
  uint32_t stream_window = 16;

  // The call's context, sent as StartCall's plain fields (runtime.proto's
  // README, "Call context"); empty: none. They are checked by the daemon: a
  // malformed traceparent or an empty baggage key fails the call with
  // INVALID_ARGUMENT and RemoteError{type "BadRequest"} naming the field.
  //
  // W3C trace parent, "00-<32 hex trace-id>-<16 hex parent-id>-<2 hex
  // flags>": spans the callable opens join that trace under that parent.
  std::string traceparent;
  // W3C tracestate; only an "agentix=<24 hex>" entry whose first 16 digits
  // are the traceparent's parent-id is read (the full agentix span id).
  std::string tracestate;
  // String baggage: agentix.context.get(key) in the sandbox, for this call.
  std::map<std::string, std::string> baggage;
};

class Client;
namespace client_internal {
struct Call;
class Connection;
}  // namespace client_internal

// A call started with Client::Start. Wait() blocks for its encoded result.
// Destroying an unfinished Call cancels it.
class Call {
 public:
  Call(Call&&) noexcept;
  Call& operator=(Call&&) noexcept;
  ~Call();

  // The msgpack bytes of the returned value, or why it failed.
  absl::StatusOr<std::string> Wait();
  template <typename T>
  absl::StatusOr<T> Wait() {
    absl::StatusOr<std::string> bytes = Wait();
    if (!bytes.ok()) return bytes.status();
    return Decode<T>(*bytes);
  }
  // Asks the sandbox to stop the call; Wait() then returns CANCELLED with
  // RemoteError{type "Cancelled"} (or the result, if it won the race).
  void Cancel();
  const std::string& id() const;

 private:
  friend class Client;
  Call(std::shared_ptr<client_internal::Connection> connection,
       std::shared_ptr<client_internal::Call> call);
  std::shared_ptr<client_internal::Connection> connection_;
  std::shared_ptr<client_internal::Call> call_;
};

// A streaming call (a generator in the sandbox). Next() yields items in
// order; the sandbox runs at most `stream_window` items ahead of Next().
class Stream {
 public:
  Stream(Stream&&) noexcept;
  Stream& operator=(Stream&&) noexcept;
  ~Stream();  // cancels an unfinished stream

  // The next item's msgpack bytes; nullopt once the generator returned (its
  // return value is then Result()); an error when the call failed.
  absl::StatusOr<std::optional<std::string>> Next();
  template <typename T>
  absl::StatusOr<std::optional<T>> Next() {
    absl::StatusOr<std::optional<std::string>> item = Next();
    if (!item.ok()) return item.status();
    if (!item->has_value()) return std::optional<T>();
    absl::StatusOr<T> value = Decode<T>(**item);
    if (!value.ok()) return value.status();
    return std::optional<T>(*std::move(value));
  }
  // The generator's return value (msgpack), after Next() returned nullopt.
  const std::string& Result() const;
  void Cancel();

 private:
  friend class Client;
  Stream(std::shared_ptr<client_internal::Connection> connection,
         std::shared_ptr<client_internal::Call> call);
  std::shared_ptr<client_internal::Connection> connection_;
  std::shared_ptr<client_internal::Call> call_;
  std::string result_;
};

// One log record of the sandbox (runtime.proto's LogRecord, the fields a
// C++ host uses).
struct LogRecord {
  uint64_t seq = 0;
  std::string logger;
  int32_t level = 0;
  std::string level_name;
  std::string message;
  int64_t time_unix_nanos = 0;
  std::string call_id;
  std::string exception_text;
  int origin = 0;  // runtime.proto's LogOrigin
  // The record's extra attributes (logger.info(..., extra={...})): a
  // msgpack map, empty when there are none (Decode<msgpack::object_handle>).
  std::string extras;
};

// A span attribute's value as text: strings as they are, other scalars
// (int, float, bool) formatted, bytes raw (runtime.proto's AttributeValue).
using SpanAttributes = std::vector<std::pair<std::string, std::string>>;

// An event inside a span (span.add_event(name, **attributes)).
struct SpanEventRecord {
  std::string name;
  int64_t time_unix_nanos = 0;
  SpanAttributes attributes;
};

// One trace/span lifecycle event (runtime.proto's TraceEvent, in part).
struct SpanEvent {
  uint64_t seq = 0;
  int kind = 0;  // runtime.proto's TraceEventKind
  std::string trace_id;  // agentix ids ("trace_<hex>", "span_<hex>")
  std::string span_id;
  std::string parent_id;
  std::string name;
  int status = 0;  // runtime.proto's SpanStatusCode
  std::string error_message;
  std::string call_id;
  SpanAttributes attributes;  // span attributes (starts and ends)
  std::vector<SpanEventRecord> events;  // SPAN_END only
};

// An open Logs or Traces subscription; destroying it ends it. Its callback
// runs on the subscription's own thread, in seq order, each seq once (it is
// resumed after a broken connection from the last seq it handled), and must
// not throw.
class Subscription {
 public:
  virtual ~Subscription() = default;
  // The last seq handed to the callback.
  virtual uint64_t last_seq() const = 0;
};

class Client {
 public:
  // Opens the channel and checks the daemon answers (GetInfo, bounded by
  // connect_timeout). UNAVAILABLE / DEADLINE_EXCEEDED when it does not,
  // UNAUTHENTICATED for a wrong token.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ConnectOptions options);
  ~Client();  // cancels unfinished calls and ends subscriptions

  // Runs `callable` ("module::qualname") with positional `args` and returns
  // its result decoded as R (msgpack::object_handle: any value).
  template <typename R, typename... A>
  absl::StatusOr<R> Remote(absl::string_view callable, const A&... args) {
    return RemoteWith<R>(callable, Arguments(args...), CallOptions());
  }
  template <typename R>
  absl::StatusOr<R> RemoteWith(absl::string_view callable,
                               const Arguments& args,
                               const CallOptions& options) {
    absl::StatusOr<Call> call = StartWaited(callable, args, options);
    if (!call.ok()) return call.status();
    return call->Wait<R>();
  }

  absl::StatusOr<Call> Start(absl::string_view callable, const Arguments& args,
                             const CallOptions& options = CallOptions());
  // Same, with `[args, kwargs]` already msgpack-encoded.
  absl::StatusOr<Call> StartEncoded(absl::string_view callable,
                                    std::string arguments,
                                    const CallOptions& options = CallOptions());
  absl::StatusOr<Stream> StartStream(absl::string_view callable,
                                     const Arguments& args,
                                     const CallOptions& options = CallOptions());

  // Subscribes to this client's log records / span events (and those no
  // call owns), from `after_seq` on (0: what the daemon still buffers).
  // While a subscription is open, a call's result is returned only after
  // the records and events it emitted were handed to the callback.
  absl::StatusOr<std::unique_ptr<Subscription>> SubscribeLogs(
      std::function<void(const LogRecord&)> on_record, uint64_t after_seq = 0);
  absl::StatusOr<std::unique_ptr<Subscription>> SubscribeSpans(
      std::function<void(const SpanEvent&)> on_event, uint64_t after_seq = 0);

  // How many times the Calls stream was re-established after breaking.
  int reconnects() const;
  // The wire of the current (or last) Calls stream: kFrames or kGrpc.
  CallsWire calls_wire() const;

 private:
  explicit Client(std::shared_ptr<client_internal::Connection> connection);
  // Start for a caller that Wait()s at once (it may read the result itself).
  absl::StatusOr<Call> StartWaited(absl::string_view callable,
                                   const Arguments& args,
                                   const CallOptions& options);
  std::shared_ptr<client_internal::Connection> connection_;
};

}  // namespace agentix

#endif  // AGENTIX_HOST_CC_AGENTIX_CLIENT_H_
