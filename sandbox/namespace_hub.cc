#include "sandbox/namespace_hub.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace agentix::sandbox {

absl::Status NamespaceHub::CheckName(absl::string_view name) {
  return CheckNamespaceName(name);
}

absl::Status NamespaceHub::CheckHostEvent(
    const runtime::v1::NamespaceEvent& event) {
  return CheckHostNamespaceEvent(event);
}

runtime::v1::NamespaceEvent NamespaceHub::HostConnectedEvent() {
  return sandbox::HostConnectedEvent();
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

void NamespaceHub::UnclaimDirect(const NamespaceSubscriber* subscriber) {
  absl::MutexLock lock(&mu_);
  UnclaimLocked(subscriber);
}

void NamespaceHub::UnclaimLocked(const NamespaceSubscriber* subscriber) {
  for (auto it = direct_.begin(); it != direct_.end();) {
    auto next = std::next(it);
    if (it->second == subscriber) direct_.erase(it);
    it = next;
  }
}

void NamespaceHub::Unsubscribe(const NamespaceSubscriber* subscriber) {
  absl::MutexLock lock(&mu_);
  UnclaimLocked(subscriber);
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
  const NamespaceSubscriber* direct = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = subscribers_.find(name);
    if (it != subscribers_.end()) targets = it->second;
    auto d = direct_.find(name);
    if (d != direct_.end()) direct = d->second;
  }
  // Outside mu_: Deliver takes the stream writer's lock, and a reaction
  // holding that lock may call Unsubscribe.
  size_t delivered = 0;
  for (const auto& target : targets) {
    // A handed-over stream is the worker's to write: its host has them
    // (until the hand-over its sink still holds them for a relayed
    // fallback; after it, the sink is closed and drops them).
    if (target->Deliver(events) || target.get() == direct) ++delivered;
  }
  return delivered;
}

size_t NamespaceHub::Subscribers(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = subscribers_.find(name);
  return it == subscribers_.end() ? 0 : it->second.size();
}

bool NamespaceHub::ClaimDirect(const std::string& name,
                               const NamespaceSubscriber* subscriber) {
  absl::MutexLock lock(&mu_);
  auto it = subscribers_.find(name);
  if (it == subscribers_.end() || it->second.size() != 1 ||
      it->second[0].get() != subscriber || direct_.contains(name)) {
    return false;
  }
  direct_[name] = subscriber;
  return true;
}

bool NamespaceHub::OthersAreDirect(const std::string& name,
                                   const NamespaceSubscriber* subscriber) {
  absl::MutexLock lock(&mu_);
  auto it = subscribers_.find(name);
  auto d = direct_.find(name);
  if (it == subscribers_.end() || d == direct_.end()) return false;
  for (const auto& s : it->second) {
    if (s.get() != subscriber && s.get() != d->second) return false;
  }
  return true;
}

bool NamespaceHub::HasDirect(const std::string& name) {
  absl::MutexLock lock(&mu_);
  return direct_.contains(name);
}

size_t NamespaceHub::OpenStreams() {
  absl::MutexLock lock(&mu_);
  return open_streams_;
}

}  // namespace agentix::sandbox
