// libFuzzer target for the host's NamespaceResponse decoder
// (host/python/native/namespace_wire.h), checked against protobuf's own
// parser (the generated C++ class) on every input:
// - whenever the decoder returns a response, protobuf parses the same bytes
//   and reads the same `opened` flag and the same events (name and payload,
//   in order): the decoder never accepts what protobuf refuses, nor reads
//   anything differently;
// - returned event names are valid UTF-8 (Python turns them into str).
// The decoder may refuse what protobuf accepts (the host then parses those
// with protobuf); the share it decodes is printed by -print_final_stats
// only indirectly, through coverage.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "agentix/runtime/v1/runtime.pb.h"
#include "base/utf8.h"
#include "host/python/native/namespace_wire.h"

namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "namespace_wire_fuzzer: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto view = agentix::host::DecodeNamespaceResponse(bytes);
  if (!view) return 0;
  agentix::runtime::v1::NamespaceResponse parsed;
  if (!parsed.ParseFromString(bytes)) Fail("decoded what protobuf refuses");
  if (view->opened != parsed.opened()) Fail("opened differs");
  if (view->events.size() != static_cast<size_t>(parsed.events_size())) {
    Fail("event count differs");
  }
  for (int i = 0; i < parsed.events_size(); ++i) {
    const auto& event = view->events[static_cast<size_t>(i)];
    if (event.event != parsed.events(i).event()) Fail("event name differs");
    if (event.data != parsed.events(i).data()) Fail("event payload differs");
    if (!agentix::base::IsValidUtf8(event.event)) Fail("name not UTF-8");
  }
  return 0;
}
