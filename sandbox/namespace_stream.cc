#include "sandbox/namespace_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/log.h"

namespace agentix::sandbox {

NamespaceStream::NamespaceStream(SessionManager* manager,
                                 std::shared_ptr<NamespaceStreamSink> sink)
    : manager_(manager), sink_(std::move(sink)) {}

bool NamespaceStream::Handle(const runtime::v1::NamespaceRequest& request) {
  if (request.has_open()) return Open(request.open().namespace_());
  if (!request.has_event()) return true;  // an empty message: nothing to do
  if (name_.empty()) {
    sink_->Fail(
        absl::FailedPreconditionError("send OpenNamespace before any event"));
    return false;
  }
  absl::Status done = NamespaceHub::CheckHostEvent(request.event());
  if (done.ok()) done = manager_->SendNamespaceEvent(name_, request.event());
  if (!done.ok()) {
    sink_->Fail(done);
    return false;
  }
  return true;
}

void NamespaceStream::BadMessage(absl::string_view error) {
  sink_->Fail(absl::InvalidArgumentError(
      absl::StrCat("unparseable NamespaceRequest message (", error, ")")));
}

void NamespaceStream::Close() {
  if (!name_.empty()) manager_->namespaces().Unsubscribe(sink_.get());
}

bool NamespaceStream::Open(const std::string& name) {
  if (!name_.empty()) {
    sink_->Fail(absl::FailedPreconditionError(
        absl::StrCat("this stream already carries namespace ", name_,
                     "; open one stream per namespace")));
    return false;
  }
  absl::Status valid = NamespaceHub::CheckName(name);
  if (!valid.ok()) {
    sink_->Fail(valid);
    return false;
  }
  runtime::v1::NamespaceResponse header;
  header.set_namespace_(name);
  header.set_instance_id(manager_->logs().instance_id());
  // Events broadcast from the moment of subscribing wait behind the
  // handshake, so `opened` is always the first message.
  sink_->HoldUntilOpened(header);
  absl::Status subscribed = manager_->namespaces().Subscribe(name, sink_);
  if (!subscribed.ok()) {
    sink_->Fail(subscribed);
    return false;
  }
  name_ = name;
  header.set_opened(true);
  // A name whose stream the worker serves: it writes the name's events
  // on the link for this one too (docs/DIRECT-CALLS.md stage 8).
  if (manager_->namespaces().HasDirect(name)) {
    manager_->TellNamespaceRelayed(name);
  }
  if (direct_asked_) {
    opened_ = std::move(header);  // ServeRelayed, or the worker, answers
    return true;
  }
  sink_->WriteOpened(std::move(header));
  TellHostConnected();
  return true;
}

void NamespaceStream::ServeRelayed() {
  direct_asked_ = false;
  sink_->WriteOpened(std::move(opened_));
  TellHostConnected();
}

void NamespaceStream::TellHostConnected() {
  // Tells the sandbox a host is listening, so requests whose event or
  // reply a broken connection lost are sent again (agentix.sio).
  absl::Status told =
      manager_->SendNamespaceEvent(name_, NamespaceHub::HostConnectedEvent());
  if (!told.ok()) {
    AGX_LOG(Debug, "namespace {}: worker not told of the host: {}", name_,
            std::string(told.message()));
  }
}

std::shared_ptr<NamespaceStreamSink> NamespaceStream::Release() {
  name_.clear();
  return sink_;
}

}  // namespace agentix::sandbox
