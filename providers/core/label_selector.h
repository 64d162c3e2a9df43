// Kubernetes label syntax: validating label maps and parsing/matching label
// selectors ("k=v", "k==v", "k!=v", "k in (a,b)", "k notin (a,b)", "k",
// "!k", joined by commas = AND).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace agentix::providers {

// Labels reserved for providerd ("agentix.dev/sandbox-id", "agentix.dev/pool").
inline constexpr char kReservedLabelPrefix[] = "agentix.dev/";

// [prefix/]name: name ≤ 63 chars of [A-Za-z0-9._-], alphanumeric at both
// ends; prefix a DNS subdomain ≤ 253 chars. "" when valid, else why not.
std::string LabelKeyError(absl::string_view key);
// ≤ 63 chars of [A-Za-z0-9._-], alphanumeric at both ends, or empty.
std::string LabelValueError(absl::string_view value);
// INVALID_ARGUMENT / INVALID_SPEC naming the bad key or value; with
// `allow_reserved` false, keys under agentix.dev/ are refused too.
absl::Status ValidateLabels(const std::map<std::string, std::string>& labels,
                            bool allow_reserved);

class LabelSelector {
 public:
  // INVALID_ARGUMENT / INVALID_LABEL_SELECTOR naming the bad part. An empty
  // selector matches everything.
  static absl::StatusOr<LabelSelector> Parse(absl::string_view text);
  bool Matches(const std::map<std::string, std::string>& labels) const;
  bool empty() const { return terms_.empty(); }

  template <typename Map>
  bool MatchesMap(const Map& labels) const {
    std::map<std::string, std::string> copy(labels.begin(), labels.end());
    return Matches(copy);
  }

 private:
  enum class Op { kEq, kNotEq, kIn, kNotIn, kExists, kNotExists };
  struct Term {
    std::string key;
    Op op;
    std::vector<std::string> values;
  };
  std::vector<Term> terms_;
};

}  // namespace agentix::providers
