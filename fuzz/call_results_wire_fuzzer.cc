// libFuzzer target for the host's decoder of CallsResponses of CallResults
// (host/python/native/call_results_wire.h), checked against protobuf's own
// parser (the generated C++ class) on every input:
// - whenever the decoder returns results, protobuf parses the same bytes,
//   finds as many events, each a CallResult, with the same fields: the
//   decoder never accepts what protobuf refuses, nor reads anything
//   differently;
// - returned call ids are valid UTF-8 (Python turns them into str) and every
//   encoding is unspecified or pickle.
// The decoder may refuse what protobuf accepts (the host then reads those
// as before).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "agentix/runtime/v1/runtime.pb.h"
#include "base/utf8.h"
#include "host/python/native/call_results_wire.h"

namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "call_results_wire_fuzzer: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto results = agentix::host::DecodeCallResults(bytes);
  if (!results) return 0;
  agentix::runtime::v1::CallsResponse parsed;
  if (!parsed.ParseFromString(bytes)) Fail("decoded what protobuf refuses");
  if (results->size() != static_cast<size_t>(parsed.events_size())) {
    Fail("event count differs");
  }
  for (int i = 0; i < parsed.events_size(); ++i) {
    if (!parsed.events(i).has_result()) Fail("an event is not a result");
    const auto& result = parsed.events(i).result();
    const auto& view = (*results)[static_cast<size_t>(i)];
    if (view.call_id != result.call_id()) Fail("call_id differs");
    if (view.encoding != static_cast<uint64_t>(result.encoding())) Fail("encoding differs");
    if (view.value != result.value()) Fail("value differs");
    if (view.value_size != result.value_size()) Fail("value_size differs");
    if (view.log_seq != result.log_seq()) Fail("log_seq differs");
    if (view.trace_seq != result.trace_seq()) Fail("trace_seq differs");
    if (!agentix::base::IsValidUtf8(view.call_id)) Fail("call_id not UTF-8");
    if (view.encoding > 1) Fail("encoding neither unspecified nor pickle");
  }
  return 0;
}
