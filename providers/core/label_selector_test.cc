#include "providers/core/label_selector.h"

#include <catch2/catch.hpp>

#include "providers/core/errors.h"

namespace agentix::providers {
namespace {

using Labels = std::map<std::string, std::string>;

bool Match(const std::string& selector, const Labels& labels) {
  auto parsed = LabelSelector::Parse(selector);
  INFO(selector << ": " << parsed.status().ToString());
  REQUIRE(parsed.ok());
  return parsed->Matches(labels);
}

TEST_CASE("Label selectors: every Kubernetes operator matches as documented", "[labels]") {
  Labels l = {{"team", "ml"}, {"env", "prod"}, {"agentix.dev/pool", "p1"}};
  CHECK(Match("", l));
  CHECK(Match("team=ml", l));
  CHECK(Match("team==ml", l));
  CHECK_FALSE(Match("team=web", l));
  CHECK(Match("team!=web", l));
  CHECK_FALSE(Match("team!=ml", l));
  CHECK(Match("missing!=x", l));
  CHECK(Match("env in (prod, staging)", l));
  CHECK_FALSE(Match("env in (staging)", l));
  CHECK(Match("env notin (staging,dev)", l));
  CHECK_FALSE(Match("env notin (prod)", l));
  CHECK(Match("team", l));
  CHECK_FALSE(Match("owner", l));
  CHECK(Match("!owner", l));
  CHECK_FALSE(Match("!team", l));
  CHECK(Match("agentix.dev/pool=p1", l));
  CHECK(Match(" team = ml , env in (prod) , !owner ", l));
  CHECK_FALSE(Match("team=ml,env=dev", l));  // comma is AND
  CHECK(Match("missing notin (a)", l));
}

TEST_CASE("Label selectors: malformed ones are INVALID_LABEL_SELECTOR naming the part",
          "[labels]") {
  for (const char* bad : {"team=ml,", ",", "env in (prod", "env in prod)", "env in ()",
                          "env within (a)", "=ml", "team=m l", "bad key=1", "!",
                          "team=-x", "a/b/c=1", "env in ((a))", "-team"}) {
    auto parsed = LabelSelector::Parse(bad);
    INFO(bad);
    REQUIRE_FALSE(parsed.ok());
    CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(ReasonOf(parsed.status()) == kReasonInvalidSelector);
  }
  auto parsed = LabelSelector::Parse("team=ml,env in (pr*d)");
  REQUIRE_FALSE(parsed.ok());
  CHECK(std::string(parsed.status().message()).find("env in (pr*d)") != std::string::npos);
}

TEST_CASE("Labels: key/value syntax and the reserved prefix", "[labels]") {
  CHECK(ValidateLabels({{"team", "ml"}, {"example.com/x", ""}, {"a.b-c_d", "v.1-2_3"}}, false)
            .ok());
  CHECK(LabelKeyError(std::string(64, 'a')) != "");
  CHECK(LabelValueError(std::string(64, 'a')) != "");
  CHECK(LabelValueError(std::string(63, 'a')) == "");
  CHECK(LabelKeyError("Example.com/x") != "");  // prefix must be lowercase DNS
  absl::Status reserved = ValidateLabels({{"agentix.dev/pool", "x"}}, false);
  CHECK(reserved.code() == absl::StatusCode::kInvalidArgument);
  CHECK(ReasonOf(reserved) == kReasonInvalidSpec);
  CHECK(std::string(reserved.message()).find("reserved") != std::string::npos);
  CHECK(ValidateLabels({{"agentix.dev/pool", "x"}}, true).ok());
  absl::Status bad_value = ValidateLabels({{"team", "a b"}}, false);
  CHECK(std::string(bad_value.message()).find("team") != std::string::npos);
}

}  // namespace
}  // namespace agentix::providers
