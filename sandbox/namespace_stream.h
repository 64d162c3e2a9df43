// NamespaceStream: one host Namespace stream's logic (RuntimeService
// .Namespace, runtime.proto), independent of the transport carrying it: the
// gRPC stream (runtime_service.cc) and the frame wire (frame_wire_server.cc,
// docs/FRAME-WIRE.md) each parse the host's messages and give them to it,
// and write what it decides through a NamespaceStreamSink of their own.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "agentix/runtime/v1/runtime.pb.h"
#include "sandbox/namespace_hub.h"
#include "sandbox/session_manager.h"

namespace agentix::sandbox {

// The write side of one Namespace stream. Deliver (NamespaceSubscriber) may
// run on any thread (the hub's broadcasts come from worker reader threads).
class NamespaceStreamSink : public NamespaceSubscriber {
 public:
  // From now on every message carries `header`'s fields (namespace, instance
  // id), and delivered events wait until WriteOpened has written the
  // handshake, so that `opened` is always the first message.
  virtual void HoldUntilOpened(runtime::v1::NamespaceResponse header) = 0;
  // Writes `opened` (no events), then what was held back.
  virtual void WriteOpened(runtime::v1::NamespaceResponse opened) = 0;
  // Ends the stream with `status` (never OK); what is queued is dropped and
  // later deliveries are refused.
  virtual void Fail(const absl::Status& status) = 0;
};

// Not thread-safe: the transport calls Handle, BadMessage and Close from one
// reading thread at a time.
class NamespaceStream {
 public:
  // `manager` must outlive the stream.
  NamespaceStream(SessionManager* manager,
                  std::shared_ptr<NamespaceStreamSink> sink);
  ~NamespaceStream() { Close(); }
  NamespaceStream(const NamespaceStream&) = delete;
  NamespaceStream& operator=(const NamespaceStream&) = delete;

  // One parsed host message: OpenNamespace registers the stream with the hub
  // and answers `opened`; an event goes to the worker. False once the stream
  // has been ended (through the sink's Fail): stop reading it.
  bool Handle(const runtime::v1::NamespaceRequest& request);
  // The host asked for a direct stream (docs/DIRECT-CALLS.md stage 8): a
  // successful OpenNamespace neither answers `opened` nor tells the worker
  // of the host. The transport hands the stream over (the worker answers;
  // SessionManager::HandOverNamespace tells it) or calls ServeRelayed.
  void AskedForDirect() { direct_asked_ = true; }
  // Answers `opened`, then tells the worker of the host, as a relayed
  // stream's Open does.
  void ServeRelayed();
  // The open namespace; empty before OpenNamespace.
  const std::string& name() const { return name_; }
  // What the hub knows the stream by.
  const NamespaceSubscriber* subscriber() const { return sink_.get(); }
  // The stream was handed to the worker: its hub slot is no longer this
  // object's to drop (Close does nothing); returns its sink.
  std::shared_ptr<NamespaceStreamSink> Release();
  // A message that is not a NamespaceRequest: ends the stream with
  // INVALID_ARGUMENT naming `error`.
  void BadMessage(absl::string_view error);
  // The stream is gone: the hub forgets its sink. Idempotent.
  void Close();

 private:
  bool Open(const std::string& name);
  void TellHostConnected();

  SessionManager* const manager_;
  const std::shared_ptr<NamespaceStreamSink> sink_;
  std::string name_;  // the open namespace; empty before OpenNamespace
  bool direct_asked_ = false;
  runtime::v1::NamespaceResponse opened_;  // while direct_asked_
};

}  // namespace agentix::sandbox
