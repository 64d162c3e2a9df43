// Random ids and tokens (from the kernel's CSPRNG via OpenSSL) and stable
// content hashes of protos (deterministic serialization + SHA-256), which
// are journaled and so must not change between runs.
#pragma once

#include <string>

#include "google/protobuf/message.h"

namespace agentix::providers {

// `prefix` + `chars` lowercase base32 characters ([a-z2-7]).
std::string RandomId(const std::string& prefix, int chars);
// 32 random bytes, base64url without padding (43 characters).
std::string RandomToken();
// Hex SHA-256 of the message's deterministic serialization.
std::string ProtoHash(const google::protobuf::Message& message);
// [a-z0-9][a-z0-9-]{0,62}
bool IsValidSandboxId(const std::string& id);

}  // namespace agentix::providers
