#include "sandbox/namespace_hub.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace agentix::sandbox {

absl::Status NamespaceHub::CheckName(absl::string_view name) {
  if (name.size() > kMaxNamespaceBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace name of ", name.size(),
                     " bytes exceeds the limit of ", kMaxNamespaceBytes));
  }
  if (name.empty() || name[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace '", name, "' must start with '/' (e.g. '/myplugin')"));
  }
  if (name == "/") {
    return absl::InvalidArgumentError(
        "namespace '/' cannot be opened: name the plugin's namespace");
  }
  if (name == "/rpc" || name == "/log" || name == "/trace") {
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace '", name,
        "' is reserved by agentix-core; choose another name for the plugin"));
  }
  return absl::OkStatus();
}

absl::Status NamespaceHub::CheckHostEvent(
    const runtime::v1::NamespaceEvent& event) {
  // Host-chosen names the daemon forwards to the worker (which keeps
  // handlers and pending requests by them) are bounded.
  if (event.event().size() > kMaxEventNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("event name of ", event.event().size(),
                     " bytes exceeds the limit of ", kMaxEventNameBytes));
  }
  if (event.request_id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id of ", event.request_id().size(),
                     " bytes exceeds the limit of ", kMaxRequestIdBytes));
  }
  if (event.event() == kHostConnectedEvent) {
    return absl::InvalidArgumentError(absl::StrCat(
        "event name ", kHostConnectedEvent, " is reserved for the daemon"));
  }
  return absl::OkStatus();
}

runtime::v1::NamespaceEvent NamespaceHub::HostConnectedEvent() {
  runtime::v1::NamespaceEvent connected;
  connected.set_event(kHostConnectedEvent);
  connected.set_data(std::string(1, '\xc0'));  // msgpack nil
  return connected;
}

absl::Status NamespaceHub::Subscribe(
    const std::string& name, std::shared_ptr<NamespaceSubscriber> subscriber) {
  absl::MutexLock lock(&mu_);
  if (open_streams_ >= max_streams_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "too many namespace streams open (", max_streams_,
        "); close some or start the daemon with a higher "
        "--max-namespace-streams"));
  }
  ++open_streams_;
  subscribers_[name].push_back(std::move(subscriber));
  return absl::OkStatus();
}

void NamespaceHub::Unsubscribe(const NamespaceSubscriber* subscriber) {
  absl::MutexLock lock(&mu_);
  for (auto it = subscribers_.begin(); it != subscribers_.end();) {
    auto& list = it->second;
    const auto removed = std::remove_if(
        list.begin(), list.end(),
        [subscriber](const auto& s) { return s.get() == subscriber; });
    open_streams_ -= static_cast<size_t>(list.end() - removed);
    list.erase(removed, list.end());
    if (list.empty()) {
      subscribers_.erase(it++);
    } else {
      ++it;
    }
  }
}

size_t NamespaceHub::Broadcast(const std::string& name,
                               const std::vector<NamespaceEventPtr>& events) {
  std::vector<std::shared_ptr<NamespaceSubscriber>> targets;
  {
    absl::MutexLock lock(&mu_);
    auto it = subscribers_.find(name);
    if (it != subscribers_.end()) targets = it->second;
  }
  // Outside mu_: Deliver takes the stream writer's lock, and a reaction
  // holding that lock may call Unsubscribe.
  size_t delivered = 0;
  for (const auto& target : targets) {
    if (target->Deliver(events)) ++delivered;
  }
  return delivered;
}

size_t NamespaceHub::Subscribers(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = subscribers_.find(name);
  return it == subscribers_.end() ? 0 : it->second.size();
}

size_t NamespaceHub::OpenStreams() {
  absl::MutexLock lock(&mu_);
  return open_streams_;
}

}  // namespace agentix::sandbox
