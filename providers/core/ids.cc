#include "providers/core/ids.h"

#include <openssl/rand.h>
#include <openssl/sha.h>

#include <cstdint>
#include <vector>

#include "absl/strings/escaping.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace agentix::providers {
namespace {
void RandomBytes(unsigned char* out, int n) {
  if (RAND_bytes(out, n) != 1) abort();  // no entropy: nothing safe to do
}
}  // namespace

std::string RandomId(const std::string& prefix, int chars) {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz234567";
  std::vector<unsigned char> bytes(chars);
  RandomBytes(bytes.data(), chars);
  std::string id = prefix;
  for (unsigned char b : bytes) id.push_back(kAlphabet[b & 31]);
  return id;
}

std::string RandomToken() {
  unsigned char bytes[32];
  RandomBytes(bytes, sizeof bytes);
  return absl::WebSafeBase64Escape(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof bytes));
}

std::string ProtoHash(const google::protobuf::Message& message) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&out);
  }
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), sizeof digest));
}

bool IsValidSandboxId(const std::string& id) {
  if (id.empty() || id.size() > 63) return false;
  auto ok = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!ok(id[0])) return false;
  for (char c : id) {
    if (!ok(c) && c != '-') return false;
  }
  return true;
}

}  // namespace agentix::providers
