// A protobuf message's bytes with map entries in a fixed order, so that two
// equal messages compare equal as strings: the fuzzers compare what they
// parsed against what they expected this way.
#ifndef AGENTIX_FUZZ_DETERMINISTIC_BYTES_H_
#define AGENTIX_FUZZ_DETERMINISTIC_BYTES_H_

#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message_lite.h"

namespace agentix::fuzz {

inline std::string DeterministicBytes(const google::protobuf::MessageLite& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }  // the coded stream flushes into `out` when it goes
  return out;
}

}  // namespace agentix::fuzz

#endif  // AGENTIX_FUZZ_DETERMINISTIC_BYTES_H_
