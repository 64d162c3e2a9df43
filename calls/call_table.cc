#include "calls/call_table.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "wire/call_context.h"

namespace agentix::calls {

using runtime::v1::SandboxEvent;
using runtime::v1::StartCall;

bool HasNoArguments(const StartCall& start, std::string_view args) {
  return args.empty() && start.arguments_size() == 0;
}

StartCall WithEmptyArguments(const StartCall& start) {
  StartCall with_empty = start;
  with_empty.set_arguments(start.encoding() == runtime::v1::ENCODING_MSGPACK
                               ? std::string("\x92\x90\x80", 3)  // [[], {}]
                               : std::string("\x80\x02)}\x86.", 6));  // ((), {})
  return with_empty;
}

SandboxEventPtr RefuseArguments(const StartCall& start, std::string_view args,
                                uint64_t max_payload_bytes) {
  const std::string& id = start.call_id();
  // ENCODING_UNSPECIFIED means pickle, which every Python host sends with
  // protocol 2 or later (first byte PROTO, 0x80). Anything else is most
  // likely another language's msgpack sent without setting the encoding.
  if (start.encoding() == runtime::v1::ENCODING_UNSPECIFIED && !args.empty() &&
      args[0] != '\x80') {
    return BadRequest(
        id,
        "StartCall.arguments is not a pickle (it does not start with "
        "0x80), and StartCall.encoding is ENCODING_UNSPECIFIED, which "
        "means ENCODING_PICKLE; set StartCall.encoding to "
        "ENCODING_MSGPACK for msgpack arguments");
  }
  if (auto status = sandbox::CheckCallContext(start); !status.ok()) {
    return BadRequest(id, std::string(status.message()));
  }
  const uint64_t expected =
      start.arguments_size() == 0 ? args.size() : start.arguments_size();
  if (args.size() > expected) {
    return BadRequest(id, absl::StrCat("arguments carry ", args.size(),
                                       " bytes but arguments_size says ",
                                       expected));
  }
  if (expected > max_payload_bytes) {
    return MakeCallError(id, "PayloadTooLarge",
                         absl::StrCat("arguments of ", expected,
                                      " bytes exceed the sandbox limit of ",
                                      max_payload_bytes, " bytes"),
                         absl::StatusCode::kResourceExhausted);
  }
  return nullptr;
}

ipc::Frame MakeCallFrame(const std::string& id, const StartCall& start,
                         uint64_t total_size, uint32_t max_stream_window) {
  ipc::Frame frame;
  frame.type = ipc::FrameType::kCall;
  frame.call_id = id;
  frame.callable = start.callable();
  frame.encoding = start.encoding() == runtime::v1::ENCODING_UNSPECIFIED
                       ? runtime::v1::ENCODING_PICKLE
                       : start.encoding();
  frame.total_size = total_size;
  frame.context = sandbox::WorkerContext(start);
  frame.stream_window = std::min(start.stream_window(), max_stream_window);
  return frame;
}

std::shared_ptr<SandboxEvent> EventFromWorkerFrame(ipc::Frame& frame,
                                                   bool& terminal) {
  auto event = std::make_shared<SandboxEvent>();
  terminal = true;
  switch (frame.type) {
    case ipc::FrameType::kResultChunk: {
      auto* chunk = event->mutable_result_chunk();
      chunk->set_call_id(frame.call_id);
      chunk->set_data(std::move(frame.data));
      terminal = false;
      break;
    }
    case ipc::FrameType::kStreamItem: {
      auto* item = event->mutable_stream_item();
      item->set_call_id(frame.call_id);
      item->set_index(frame.index);
      item->set_encoding(static_cast<runtime::v1::Encoding>(frame.encoding));
      item->set_value(std::move(frame.data));
      terminal = false;
      break;
    }
    case ipc::FrameType::kResult: {
      auto* result = event->mutable_result();
      result->set_call_id(frame.call_id);
      result->set_encoding(static_cast<runtime::v1::Encoding>(frame.encoding));
      result->set_value_size(frame.total_size);
      result->set_value(std::move(frame.data));
      break;
    }
    default:
      return FromWorkerError(frame.call_id, frame.error);
  }
  return event;
}

SandboxEventPtr UploadTimeoutError(const std::string& id, uint64_t received,
                                   uint64_t expected, absl::Duration idle) {
  return MakeCallError(
      id, "UploadTimeout",
      absl::StrCat("arguments incomplete: ", received, " of ", expected,
                   " bytes arrived and none for ", absl::FormatDuration(idle),
                   " (--upload-idle-timeout-s)"),
      absl::StatusCode::kDeadlineExceeded);
}

}  // namespace agentix::calls
