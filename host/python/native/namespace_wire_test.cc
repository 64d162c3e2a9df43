#include "host/python/native/namespace_wire.h"

#include <catch2/catch.hpp>
#include <string>

#include "agentix/runtime/v1/runtime.pb.h"
#include "host/python/native/proto_test_bytes.h"

namespace agentix::host {
namespace {

using runtime::v1::NamespaceResponse;

// What protobuf reads from `bytes` equals what the decoder returned.
void RequireSameAsProtobuf(const std::string& bytes,
                           const NamespaceResponseView& view) {
  NamespaceResponse parsed;
  REQUIRE(parsed.ParseFromString(bytes));
  REQUIRE(view.opened == parsed.opened());
  REQUIRE(view.events.size() == static_cast<size_t>(parsed.events_size()));
  for (int i = 0; i < parsed.events_size(); ++i) {
    CHECK(view.events[i].event == parsed.events(i).event());
    CHECK(view.events[i].data == parsed.events(i).data());
  }
}

NamespaceResponse Sample() {
  NamespaceResponse response;
  response.set_namespace_("/llm");
  response.set_instance_id("d41d8cd98f00b204");
  auto* request = response.add_events();
  request->set_event("complete");
  request->set_data(
      std::string("\x82\xaarequest_id\xa1x\xa4"
                  "data\x00",
                  20));
  request->set_request_id("x");
  auto* reply = response.add_events();
  reply->set_event("complete:error");
  reply->set_data("\x80");
  reply->mutable_error()->set_type("ValueError");
  reply->mutable_error()->set_message("température élevée ✓");
  reply->mutable_error()->set_status_code(-429);
  response.add_events()->set_event("événement/été:𝄞");
  return response;
}

using test_bytes::AppendBytesField;
using test_bytes::AppendTag;
using test_bytes::AppendVarint;

TEST_CASE("Namespace responses decode as protobuf reads them",
          "[namespace_wire]") {
  const std::string bytes = Sample().SerializeAsString();
  auto view = DecodeNamespaceResponse(bytes);
  REQUIRE(view.has_value());
  CHECK_FALSE(view->opened);
  REQUIRE(view->events.size() == 3);
  CHECK(view->events[0].event == "complete");
  CHECK(view->events[0].data.size() == 20);
  CHECK(view->events[2].event == "événement/été:𝄞");
  CHECK(view->events[2].data.empty());
  RequireSameAsProtobuf(bytes, *view);

  NamespaceResponse opened;
  opened.set_namespace_("/llm");
  opened.set_opened(true);
  auto first = DecodeNamespaceResponse(opened.SerializeAsString());
  REQUIRE(first.has_value());
  CHECK(first->opened);
  CHECK(first->events.empty());

  auto empty = DecodeNamespaceResponse("");
  REQUIRE(empty.has_value());
  CHECK_FALSE(empty->opened);
  CHECK(empty->events.empty());
}

TEST_CASE("Unknown fields are skipped and repeated fields keep the last value",
          "[namespace_wire]") {
  std::string event;
  AppendBytesField(event, 1, "first");
  AppendTag(event, 9, 0);  // unknown varint
  AppendVarint(event, 300);
  AppendBytesField(event, 1, "second");  // the last value counts
  AppendTag(event, 10, 1);               // unknown fixed64
  event.append(8, '\x01');
  AppendBytesField(event, 2, "payload");
  std::string bytes;
  AppendTag(bytes, 2, 0);
  AppendVarint(bytes, 7);   // any non-zero varint is true
  AppendTag(bytes, 15, 5);  // unknown fixed32
  bytes.append(4, '\xff');
  AppendBytesField(bytes, 4, event);
  AppendBytesField(bytes, 99, "\xff\xfe not UTF-8, unknown bytes field");
  AppendTag(bytes, 2, 0);
  AppendVarint(bytes, 0);  // opened again: false wins

  auto view = DecodeNamespaceResponse(bytes);
  REQUIRE(view.has_value());
  CHECK_FALSE(view->opened);
  REQUIRE(view->events.size() == 1);
  CHECK(view->events[0].event == "second");
  CHECK(view->events[0].data == "payload");
  RequireSameAsProtobuf(bytes, *view);
}

TEST_CASE("Malformed or doubtful responses are left to protobuf",
          "[namespace_wire]") {
  const std::string valid = Sample().SerializeAsString();
  SECTION("every prefix: decoded only when protobuf reads the same") {
    int refused = 0;
    for (size_t n = 0; n < valid.size(); ++n) {
      const std::string prefix = valid.substr(0, n);
      auto view = DecodeNamespaceResponse(prefix);
      if (view) {
        RequireSameAsProtobuf(prefix, *view);
      } else {
        ++refused;
      }
    }
    CHECK(refused > 0);
  }
  SECTION("invalid UTF-8 in any string field") {
    NamespaceResponse bad_event = Sample();
    bad_event.mutable_events(0)->set_event("caf\xc3");
    NamespaceResponse bad_namespace = Sample();
    bad_namespace.set_namespace_("/\xed\xa0\x80");
    NamespaceResponse bad_error = Sample();
    bad_error.mutable_events(1)->mutable_error()->set_type("\xc0\xaf");
    for (const NamespaceResponse* bad :
         {&bad_event, &bad_namespace, &bad_error}) {
      std::string bytes;
      REQUIRE(bad->SerializePartialToString(&bytes));
      CHECK_FALSE(DecodeNamespaceResponse(bytes).has_value());
      NamespaceResponse parsed;
      CHECK_FALSE(parsed.ParseFromString(bytes));
    }
  }
  SECTION("groups, zero field numbers and unexpected wire types") {
    std::string group;
    AppendTag(group, 7, 3);
    AppendTag(group, 7, 4);
    CHECK_FALSE(DecodeNamespaceResponse(group).has_value());
    CHECK_FALSE(
        DecodeNamespaceResponse(std::string("\x02\x00", 2)).has_value());
    std::string opened_as_bytes;
    AppendBytesField(opened_as_bytes, 2, "x");
    CHECK_FALSE(DecodeNamespaceResponse(opened_as_bytes).has_value());
    std::string eleven_byte_varint;
    AppendTag(eleven_byte_varint, 2, 0);
    eleven_byte_varint.append(10, '\x80');
    eleven_byte_varint.push_back('\x00');
    CHECK_FALSE(DecodeNamespaceResponse(eleven_byte_varint).has_value());
  }
  SECTION("tags and lengths longer than five bytes (protobuf refuses them)") {
    // Field 12 as a LEN tag written in six bytes, then a one-byte value.
    const std::string six_byte_tag("\xe2\x80\x80\x80\x80\x00\x01x", 8);
    CHECK_FALSE(DecodeNamespaceResponse(six_byte_tag).has_value());
    NamespaceResponse parsed;
    CHECK_FALSE(parsed.ParseFromString(six_byte_tag));
    // Field 99 (unknown LEN) whose length 1 is written in six bytes.
    std::string six_byte_length;
    AppendTag(six_byte_length, 99, 2);
    six_byte_length += std::string("\x81\x80\x80\x80\x80\x00x", 7);
    CHECK_FALSE(DecodeNamespaceResponse(six_byte_length).has_value());
    CHECK_FALSE(parsed.ParseFromString(six_byte_length));
  }
  SECTION("a length beyond the end") {
    std::string bytes;
    AppendTag(bytes, 4, 2);
    AppendVarint(bytes, 1000);
    bytes += "short";
    CHECK_FALSE(DecodeNamespaceResponse(bytes).has_value());
  }
}

}  // namespace
}  // namespace agentix::host
