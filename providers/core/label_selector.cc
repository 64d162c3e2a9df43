#include "providers/core/label_selector.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "providers/core/errors.h"

namespace agentix::providers {
namespace {

bool IsNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' ||
         c == '_' || c == '.';
}

// "" when `name` is a valid label name/value body (63 max, alnum ends).
std::string NameError(absl::string_view name, bool allow_empty) {
  if (name.empty()) return allow_empty ? "" : "is empty";
  if (name.size() > 63) return "is longer than 63 characters";
  if (!absl::ascii_isalnum(static_cast<unsigned char>(name.front())) ||
      !absl::ascii_isalnum(static_cast<unsigned char>(name.back()))) {
    return "must start and end with a letter or digit";
  }
  for (char c : name) {
    if (!IsNameChar(c)) return absl::StrCat("has the invalid character '",
                                            std::string(1, c), "'");
  }
  return "";
}

std::string DnsSubdomainError(absl::string_view prefix) {
  if (prefix.empty()) return "has an empty prefix";
  if (prefix.size() > 253) return "has a prefix longer than 253 characters";
  for (absl::string_view part : absl::StrSplit(prefix, '.')) {
    if (part.empty() || part.size() > 63) return "has an invalid DNS prefix";
    if (!absl::ascii_isalnum(static_cast<unsigned char>(part.front())) ||
        !absl::ascii_isalnum(static_cast<unsigned char>(part.back()))) {
      return "has an invalid DNS prefix";
    }
    for (char c : part) {
      if (!(absl::ascii_islower(static_cast<unsigned char>(c)) ||
            absl::ascii_isdigit(static_cast<unsigned char>(c)) || c == '-')) {
        return "has an invalid DNS prefix";
      }
    }
  }
  return "";
}

absl::Status SelectorError(absl::string_view part, absl::string_view why) {
  return ProviderError(absl::StatusCode::kInvalidArgument, kReasonInvalidSelector,
                       absl::StrCat("invalid label selector at '", part, "': ", why));
}

// Splits on commas that are not inside parentheses.
absl::StatusOr<std::vector<std::string>> SplitTerms(absl::string_view text) {
  std::vector<std::string> out;
  std::string current;
  int depth = 0;
  for (char c : text) {
    if (c == '(') {
      if (++depth > 1) return SelectorError(text, "nested '('");
    } else if (c == ')') {
      if (--depth < 0) return SelectorError(text, "unbalanced ')'");
    }
    if (c == ',' && depth == 0) {
      out.push_back(current);
      current.clear();
    } else {
      current.push_back(c);
    }
  }
  if (depth != 0) return SelectorError(text, "unbalanced '('");
  out.push_back(current);
  return out;
}

}  // namespace

std::string LabelKeyError(absl::string_view key) {
  if (key.empty()) return "key is empty";
  size_t slash = key.find('/');
  absl::string_view name = key;
  if (slash != absl::string_view::npos) {
    std::string prefix_error = DnsSubdomainError(key.substr(0, slash));
    if (!prefix_error.empty()) return absl::StrCat("key ", prefix_error);
    name = key.substr(slash + 1);
  }
  std::string error = NameError(name, /*allow_empty=*/false);
  return error.empty() ? "" : absl::StrCat("key name ", error);
}

std::string LabelValueError(absl::string_view value) {
  std::string error = NameError(value, /*allow_empty=*/true);
  return error.empty() ? "" : absl::StrCat("value ", error);
}

absl::Status ValidateLabels(const std::map<std::string, std::string>& labels,
                            bool allow_reserved) {
  for (const auto& [key, value] : labels) {
    std::string error = LabelKeyError(key);
    if (error.empty()) error = LabelValueError(value);
    if (!error.empty()) {
      return ProviderError(absl::StatusCode::kInvalidArgument, kReasonInvalidSpec,
                           absl::StrCat("label '", key, "': ", error));
    }
    if (!allow_reserved && absl::StartsWith(key, kReservedLabelPrefix)) {
      return ProviderError(
          absl::StatusCode::kInvalidArgument, kReasonInvalidSpec,
          absl::StrCat("label '", key, "': the prefix ", kReservedLabelPrefix,
                       " is reserved for providerd"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<LabelSelector> LabelSelector::Parse(absl::string_view text) {
  LabelSelector selector;
  if (absl::StripAsciiWhitespace(text).empty()) return selector;
  auto parts = SplitTerms(text);
  if (!parts.ok()) return parts.status();
  for (const std::string& raw : *parts) {
    absl::string_view part = absl::StripAsciiWhitespace(raw);
    if (part.empty()) return SelectorError(raw, "empty requirement");
    Term term;
    auto check_key = [&](absl::string_view key) -> absl::Status {
      std::string error = LabelKeyError(key);
      return error.empty() ? absl::OkStatus() : SelectorError(part, error);
    };
    auto check_value = [&](absl::string_view value) -> absl::Status {
      std::string error = LabelValueError(value);
      return error.empty() ? absl::OkStatus() : SelectorError(part, error);
    };
    size_t paren = part.find('(');
    if (part.front() == '!') {
      term.key = std::string(absl::StripAsciiWhitespace(part.substr(1)));
      term.op = Op::kNotExists;
      if (absl::Status s = check_key(term.key); !s.ok()) return s;
    } else if (size_t ne = part.find("!="); ne != absl::string_view::npos &&
                                            paren == absl::string_view::npos) {
      term.key = std::string(absl::StripAsciiWhitespace(part.substr(0, ne)));
      term.op = Op::kNotEq;
      term.values.emplace_back(absl::StripAsciiWhitespace(part.substr(ne + 2)));
    } else if (size_t eq = part.find('='); eq != absl::string_view::npos &&
                                           paren == absl::string_view::npos) {
      term.key = std::string(absl::StripAsciiWhitespace(part.substr(0, eq)));
      term.op = Op::kEq;
      absl::string_view rest = part.substr(eq + 1);
      if (absl::StartsWith(rest, "=")) rest.remove_prefix(1);
      term.values.emplace_back(absl::StripAsciiWhitespace(rest));
    } else if (paren != absl::string_view::npos) {
      if (part.back() != ')') return SelectorError(part, "expected ')' at the end");
      absl::string_view head = absl::StripAsciiWhitespace(part.substr(0, paren));
      std::vector<absl::string_view> words =
          absl::StrSplit(head, ' ', absl::SkipEmpty());
      if (words.size() != 2 || (words[1] != "in" && words[1] != "notin")) {
        return SelectorError(part, "expected 'key in (...)' or 'key notin (...)'");
      }
      term.key = std::string(words[0]);
      term.op = words[1] == "in" ? Op::kIn : Op::kNotIn;
      absl::string_view inside =
          part.substr(paren + 1, part.size() - paren - 2);
      if (absl::StripAsciiWhitespace(inside).empty()) {
        return SelectorError(part, "empty value set");
      }
      for (absl::string_view v : absl::StrSplit(inside, ',')) {
        term.values.emplace_back(absl::StripAsciiWhitespace(v));
      }
    } else {
      term.key = std::string(part);
      term.op = Op::kExists;
    }
    if (absl::Status s = check_key(term.key); !s.ok()) return s;
    for (const std::string& v : term.values) {
      if (absl::Status s = check_value(v); !s.ok()) return s;
    }
    selector.terms_.push_back(std::move(term));
  }
  return selector;
}

bool LabelSelector::Matches(const std::map<std::string, std::string>& labels) const {
  for (const Term& term : terms_) {
    auto it = labels.find(term.key);
    bool has = it != labels.end();
    auto in_values = [&] {
      return has && std::find(term.values.begin(), term.values.end(),
                              it->second) != term.values.end();
    };
    switch (term.op) {
      case Op::kEq:
        if (!has || it->second != term.values[0]) return false;
        break;
      case Op::kNotEq:
        if (has && it->second == term.values[0]) return false;
        break;
      case Op::kIn:
        if (!in_values()) return false;
        break;
      case Op::kNotIn:
        if (in_values()) return false;
        break;
      case Op::kExists:
        if (!has) return false;
        break;
      case Op::kNotExists:
        if (has) return false;
        break;
    }
  }
  return true;
}

}  // namespace agentix::providers
