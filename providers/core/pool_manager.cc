#include "providers/core/pool_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/message_differencer.h"
#include "providers/core/errors.h"
#include "providers/core/ids.h"

namespace agentix::providers {
namespace {

pb::SandboxSpec KeyFields(const pb::SandboxSpec& spec, const std::string& default_backend) {
  pb::SandboxSpec key;
  key.set_backend(spec.backend().empty() ? default_backend : spec.backend());
  key.set_image(spec.image());
  *key.mutable_bundle() = spec.bundle();
  key.set_platform(spec.platform());
  *key.mutable_resources() = spec.resources();
  *key.mutable_network() = spec.network();
  if (key.network().mode() == pb::Network::MODE_UNSPECIFIED) {
    key.mutable_network()->set_mode(pb::Network::NONE);
  }
  return key;
}

}  // namespace

std::string PoolKey(const pb::SandboxSpec& spec, const std::string& default_backend) {
  return ProtoHash(KeyFields(spec, default_backend)).substr(0, 16);
}

std::string PoolKeyDiff(const pb::SandboxSpec& pool_template, const pb::SandboxSpec& spec,
                        const std::string& default_backend) {
  pb::SandboxSpec a = KeyFields(pool_template, default_backend);
  pb::SandboxSpec b = KeyFields(spec, default_backend);
  using google::protobuf::util::MessageDifferencer;
  if (a.backend() != b.backend()) return "backend";
  if (a.image() != b.image()) return "image";
  if (!MessageDifferencer::Equals(a.bundle(), b.bundle())) return "bundle";
  if (a.platform() != b.platform()) return "platform";
  if (!MessageDifferencer::Equals(a.resources(), b.resources())) return "resources";
  if (!MessageDifferencer::Equals(a.network(), b.network())) return "network";
  return "";
}

absl::Status ValidateAndDefaultPool(pb::WarmPool* pool) {
  auto bad = [](std::string why) {
    return ProviderError(absl::StatusCode::kInvalidArgument, kReasonInvalidSpec, why);
  };
  if (!IsValidSandboxId(pool->name())) {
    return bad(absl::StrCat("pool name '", pool->name(),
                            "' must match [a-z0-9][a-z0-9-]{0,62}"));
  }
  if (pool->min_ready() < 0 || pool->max_total() < 0 || pool->max_creating() < 0) {
    return bad("min_ready, max_total and max_creating must not be negative");
  }
  if (pool->max_total() == 0) pool->set_max_total(pool->min_ready());
  if (pool->max_creating() == 0) pool->set_max_creating(4);
  if (pool->max_total() < pool->min_ready()) {
    return bad(absl::StrCat("max_total (", pool->max_total(), ") is below min_ready (",
                            pool->min_ready(), ")"));
  }
  if (pool->member_max_age().seconds() < 0) return bad("member_max_age is negative");
  if (pool->template_().image().empty() && pool->template_().bundle().ref_case() ==
                                               pb::BundleRef::REF_NOT_SET) {
    return bad("template needs an image or a bundle");
  }
  return absl::OkStatus();
}

int MembersToStart(const pb::WarmPool& pool, const PoolCounts& counts) {
  int live = counts.ready + counts.creating;
  int fresh = live - counts.stale;
  int by_creating = pool.max_creating() - counts.creating;
  int by_min = pool.min_ready() - fresh;
  int by_total = pool.max_total() - live;
  return std::max(0, std::min({by_creating, by_min, by_total}));
}

absl::Duration PoolBackoff(int failure_streak) {
  if (failure_streak < kPoolDegradedAfter) return absl::ZeroDuration();
  int shift = std::min(failure_streak - kPoolDegradedAfter, 9);
  return std::min(absl::Seconds(1) * (1 << shift), absl::Minutes(5));
}

}  // namespace agentix::providers
