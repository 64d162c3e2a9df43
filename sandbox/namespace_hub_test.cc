#include "sandbox/namespace_hub.h"

#include <catch2/catch.hpp>

namespace agentix::sandbox {
namespace {

class Recorder : public NamespaceSubscriber {
 public:
  bool Deliver(std::vector<NamespaceEventPtr> events) override {
    if (closed) return false;
    for (auto& e : events) received.push_back(e->event());
    return true;
  }
  std::vector<std::string> received;
  bool closed = false;
};

NamespaceEventPtr Event(const std::string& name) {
  auto e = std::make_shared<runtime::v1::NamespaceEvent>();
  e->set_event(name);
  return e;
}

TEST_CASE("Plugin namespace names: reserved and malformed ones are refused",
          "[namespace]") {
  CHECK(NamespaceHub::CheckName("/abridge").ok());
  CHECK(NamespaceHub::CheckName("/v1/proxy").ok());
  for (const char* bad : {"", "/", "abridge", "/rpc", "/log", "/trace"}) {
    absl::Status status = NamespaceHub::CheckName(bad);
    INFO(bad);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  }
  CHECK(NamespaceHub::CheckName("/log").message().find("reserved") !=
        std::string::npos);
  // Length is bounded (names are map keys here and in the worker).
  CHECK(NamespaceHub::CheckName("/" + std::string(kMaxNamespaceBytes - 1, 'n'))
            .ok());
  CHECK(NamespaceHub::CheckName("/" + std::string(kMaxNamespaceBytes, 'n'))
            .code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Broadcast reaches every stream on the namespace and no other",
          "[namespace]") {
  NamespaceHub hub;
  auto a = std::make_shared<Recorder>();
  auto b = std::make_shared<Recorder>();
  auto other = std::make_shared<Recorder>();
  REQUIRE(hub.Subscribe("/x", a).ok());
  REQUIRE(hub.Subscribe("/x", b).ok());
  REQUIRE(hub.Subscribe("/y", other).ok());
  REQUIRE(hub.Broadcast("/x", {Event("e1"), Event("e2")}) == 2);
  CHECK(a->received == std::vector<std::string>{"e1", "e2"});
  CHECK(b->received == std::vector<std::string>{"e1", "e2"});
  CHECK(other->received.empty());
  CHECK(hub.Broadcast("/nobody", {Event("e")}) == 0);
}

TEST_CASE("Unsubscribed or ended streams do not count as delivered",
          "[namespace]") {
  NamespaceHub hub;
  auto a = std::make_shared<Recorder>();
  auto b = std::make_shared<Recorder>();
  REQUIRE(hub.Subscribe("/x", a).ok());
  REQUIRE(hub.Subscribe("/x", b).ok());
  b->closed = true;
  CHECK(hub.Broadcast("/x", {Event("e")}) == 1);
  hub.Unsubscribe(a.get());
  hub.Unsubscribe(a.get());  // idempotent
  CHECK(hub.Subscribers("/x") == 1);
  hub.Unsubscribe(b.get());
  CHECK(hub.Subscribers("/x") == 0);
  CHECK(hub.Broadcast("/x", {Event("e")}) == 0);
}

TEST_CASE("The number of open namespace streams is bounded", "[namespace]") {
  NamespaceHub hub(/*max_streams=*/2);
  auto a = std::make_shared<Recorder>();
  auto b = std::make_shared<Recorder>();
  auto c = std::make_shared<Recorder>();
  REQUIRE(hub.Subscribe("/x", a).ok());
  REQUIRE(hub.Subscribe("/y", b).ok());
  absl::Status refused = hub.Subscribe("/z", c);
  CHECK(refused.code() == absl::StatusCode::kResourceExhausted);
  CHECK(refused.message().find("--max-namespace-streams") != std::string::npos);
  hub.Unsubscribe(a.get());
  CHECK(hub.Subscribe("/z", c).ok());
}

TEST_CASE("Host events: oversized names and ids and the daemon's own event are refused",
          "[namespace]") {
  runtime::v1::NamespaceEvent event;
  event.set_event(std::string(kMaxEventNameBytes, 'e'));
  event.set_request_id(std::string(kMaxRequestIdBytes, 'r'));
  CHECK(NamespaceHub::CheckHostEvent(event).ok());

  runtime::v1::NamespaceEvent long_name = event;
  long_name.set_event(std::string(kMaxEventNameBytes + 1, 'e'));
  absl::Status status = NamespaceHub::CheckHostEvent(long_name);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()).find("event name of 1025 bytes") !=
        std::string::npos);

  runtime::v1::NamespaceEvent long_id = event;
  long_id.set_request_id(std::string(kMaxRequestIdBytes + 1, 'r'));
  status = NamespaceHub::CheckHostEvent(long_id);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()).find("request_id of 257 bytes") !=
        std::string::npos);

  runtime::v1::NamespaceEvent reserved;
  reserved.set_event(kHostConnectedEvent);
  status = NamespaceHub::CheckHostEvent(reserved);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(status.message()).find("reserved for the daemon") !=
        std::string::npos);
}

TEST_CASE("The daemon tells the sandbox of a host with a nil-payload event",
          "[namespace]") {
  const runtime::v1::NamespaceEvent connected = NamespaceHub::HostConnectedEvent();
  CHECK(connected.event() == kHostConnectedEvent);
  CHECK(connected.data() == std::string(1, '\xc0'));  // msgpack nil
  CHECK(connected.request_id().empty());
  // The host may not forge it.
  CHECK(!NamespaceHub::CheckHostEvent(connected).ok());
}

TEST_CASE("A name's one stream may be claimed as handed over; it keeps its "
          "slot and counts as delivered", "[namespace]") {
  NamespaceHub hub(/*max_streams=*/2);
  auto direct = std::make_shared<Recorder>();
  auto other = std::make_shared<Recorder>();
  REQUIRE(hub.Subscribe("/p", direct).ok());
  CHECK(!hub.ClaimDirect("/q", direct.get()));  // not its name
  CHECK(!hub.ClaimDirect("/p", other.get()));   // not subscribed there
  CHECK(hub.ClaimDirect("/p", direct.get()));
  CHECK(!hub.ClaimDirect("/p", direct.get()));  // once
  CHECK(hub.HasDirect("/p"));
  CHECK(!hub.HasDirect("/q"));
  // The handed-over stream is written by the worker: the daemon delivers
  // nothing to it, yet the event had a listening host.
  direct->closed = true;
  CHECK(hub.Broadcast("/p", {Event("e1")}) == 1);
  CHECK(direct->received.empty());
  // It still holds its slot under the cap; a relayed stream joins the name.
  REQUIRE(hub.Subscribe("/p", other).ok());
  CHECK(hub.Subscribe("/r", std::make_shared<Recorder>()).code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK(hub.Broadcast("/p", {Event("e2")}) == 2);
  CHECK(other->received == std::vector<std::string>{"e2"});
  // A hand-over that did not happen makes it a relayed stream again.
  hub.UnclaimDirect(direct.get());
  CHECK(!hub.HasDirect("/p"));
  CHECK(hub.Broadcast("/p", {Event("e3")}) == 1);  // `direct` is closed
  hub.Unsubscribe(direct.get());
  CHECK(!hub.HasDirect("/p"));
  CHECK(hub.OpenStreams() == 1);
  // With two streams open, neither may be claimed.
  auto third = std::make_shared<Recorder>();
  REQUIRE(hub.Subscribe("/p", third).ok());
  CHECK(!hub.ClaimDirect("/p", other.get()));
  CHECK(!hub.ClaimDirect("/p", third.get()));
  CHECK(!hub.OthersAreDirect("/p", third.get()));  // `other` is relayed
  // A handed-over stream whose end is not reported yet: worth a wait.
  NamespaceHub two(4);
  auto old_direct = std::make_shared<Recorder>();
  auto next = std::make_shared<Recorder>();
  REQUIRE(two.Subscribe("/n", old_direct).ok());
  REQUIRE(two.ClaimDirect("/n", old_direct.get()));
  REQUIRE(two.Subscribe("/n", next).ok());
  CHECK(!two.ClaimDirect("/n", next.get()));
  CHECK(two.OthersAreDirect("/n", next.get()));
  two.Unsubscribe(old_direct.get());
  CHECK(two.ClaimDirect("/n", next.get()));
}

}  // namespace
}  // namespace agentix::sandbox
