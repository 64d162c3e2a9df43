// Warm-pool rules that do not depend on threads or backends: the pool key,
// which field of a spec differs from a pool's template, pool validation, how
// many members to start now, and the back-off after failed starts. The
// controller drives members with these.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "providers/backend.h"

namespace agentix::providers {

// Hash of {backend, image, bundle ref + digest, platform, resources,
// network}: what makes two sandboxes interchangeable before they are armed.
// env, labels, ttl, idle_timeout and annotations are applied at claim time.
std::string PoolKey(const pb::SandboxSpec& spec, const std::string& default_backend);
// The first key field ("backend", "image", "bundle", "platform",
// "resources", "network") where `spec` differs from `pool_template`; "" when
// they have the same key.
std::string PoolKeyDiff(const pb::SandboxSpec& pool_template, const pb::SandboxSpec& spec,
                        const std::string& default_backend);

// INVALID_ARGUMENT / INVALID_SPEC for a bad name or sizes. Fills defaults
// (max_total = min_ready when 0, max_creating = 4 when 0).
absl::Status ValidateAndDefaultPool(pb::WarmPool* pool);

struct PoolCounts {
  int ready = 0;     // started, healthy, unclaimed
  int creating = 0;  // launch in flight
  int stale = 0;     // of ready+creating: from an older template (ON_REPLENISH)
};
// Members to start now: keeps creating ≤ max_creating, fresh ready+creating
// ≤ min_ready and ready+creating ≤ max_total.
int MembersToStart(const pb::WarmPool& pool, const PoolCounts& counts);

inline constexpr int kPoolDegradedAfter = 3;
// Back-off after `failure_streak` consecutive failed member starts: none
// below kPoolDegradedAfter, then 1 s doubling up to 5 min.
absl::Duration PoolBackoff(int failure_streak);

}  // namespace agentix::providers
