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
  sink_->WriteOpened(std::move(header));
  // Tells the sandbox a host is listening, so requests whose event or
  // reply a broken connection lost are sent again (agentix.sio).
  absl::Status told =
      manager_->SendNamespaceEvent(name, NamespaceHub::HostConnectedEvent());
  if (!told.ok()) {
    AGX_LOG(Debug, "namespace {}: worker not told of the host: {}", name,
            std::string(told.message()));
  }
  return true;
}

}  // namespace agentix::sandbox
