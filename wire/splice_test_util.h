// Test helpers shared by the tests of what splices Calls requests
// (frame_splice_test, frame_connection_test).
#pragma once

#include <catch2/catch.hpp>
#include <cstddef>
#include <string>

#include "agentix/runtime/v1/runtime.pb.h"
#include "wire/frame_splice.h"

namespace agentix::sandbox {

// `n` bytes that differ from their neighbours, starting from `seed`.
inline std::string Bytes(size_t n, char seed) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(seed + i * 7);
  return out;
}

// The message a SplicedRequest describes, its bulk views put back in.
inline runtime::v1::CallsRequest Rebuilt(const SplicedRequest& parsed) {
  runtime::v1::CallsRequest out = parsed.request;
  REQUIRE(parsed.bulk.size() == static_cast<size_t>(out.events_size()));
  for (int i = 0; i < out.events_size(); ++i) {
    const auto& bulk = parsed.bulk[static_cast<size_t>(i)];
    if (!bulk) continue;
    runtime::v1::HostEvent* event = out.mutable_events(i);
    if (event->has_start()) {
      event->mutable_start()->set_arguments(std::string(*bulk));
    } else {
      REQUIRE(event->has_argument_chunk());
      event->mutable_argument_chunk()->set_data(std::string(*bulk));
    }
  }
  return out;
}

}  // namespace agentix::sandbox
