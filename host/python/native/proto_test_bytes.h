// Protobuf's wire encoding spelt out, for decoder tests that build the forms
// the generated serializer never writes (fields repeated or out of order,
// unknown fields, cut or malformed bytes).
#ifndef AGENTIX_HOST_PYTHON_NATIVE_PROTO_TEST_BYTES_H_
#define AGENTIX_HOST_PYTHON_NATIVE_PROTO_TEST_BYTES_H_

#include <cstdint>
#include <string>

namespace agentix::host::test_bytes {

inline void AppendVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

inline void AppendTag(std::string& out, uint32_t field, int wire_type) {
  AppendVarint(out, (uint64_t{field} << 3) | static_cast<uint64_t>(wire_type));
}

// A length-delimited field (wire type 2).
inline void AppendBytesField(std::string& out, uint32_t field,
                             const std::string& value) {
  AppendTag(out, field, 2);
  AppendVarint(out, value.size());
  out += value;
}

}  // namespace agentix::host::test_bytes

#endif  // AGENTIX_HOST_PYTHON_NATIVE_PROTO_TEST_BYTES_H_
