#include "sandbox/daemon_worker_args.h"

#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "base/cpu_affinity.h"

namespace agentix::sandbox {

bool ServesDirectCalls(const DaemonWorkerFlags& flags) {
  return flags.direct_calls && flags.calls_socket;
}

std::vector<std::string> WorkerArgsFor(const DaemonWorkerFlags& flags) {
  std::vector<std::string> args;
  if (!flags.python_home.empty()) {
    args.push_back(absl::StrCat("--python-home=", flags.python_home));
  }
  if (flags.worker_intake_spin_us > 0) {
    args.push_back(absl::StrCat("--intake-spin-us=", flags.worker_intake_spin_us));
  }
  // Only when not the default: a worker's command line stays what it was.
  if (flags.worker_intake_look_slack_us != kWorkerIntakeLookSlackUsByDefault) {
    args.push_back(
        absl::StrCat("--intake-look-slack-us=", flags.worker_intake_look_slack_us));
  }
  if (ServesDirectCalls(flags)) {
    // Without it the worker polls its bare link (the epoll set costs a
    // relayed noop ~3 %).
    args.push_back("--direct_calls");
    // --calls_cpu=off pins nothing: not the direct intake's follower either.
    if (flags.calls_cpu_off) args.push_back("--noavoid_holder_cpu");
  }
  return args;
}

void SetWorkerOptionsFor(const DaemonWorkerFlags& flags, WorkerOptions& options) {
  options.extra_args = WorkerArgsFor(flags);
  options.ledger_call_slots =
      ServesDirectCalls(flags) ? LedgerCallSlots(flags.max_retained_results) : 0;
}

absl::StatusOr<bool> CallsCpuPinsNothing(const std::string& value) {
  const absl::string_view setting = absl::StripAsciiWhitespace(value);
  if (setting == "auto" || setting == "probe") return false;
  absl::StatusOr<int> cpu = base::ParseCpuSetting(value);
  if (!cpu.ok()) return cpu.status();
  return *cpu == base::kNoCpu;
}

namespace {

// "--a-b=v" -> name "a_b", value "v"; nullopt for an argument that is no flag.
struct FlagArg {
  std::string name;
  std::optional<std::string> value;
};

std::optional<FlagArg> SplitFlag(absl::string_view arg) {
  if (arg.size() < 2 || arg[0] != '-') return std::nullopt;
  arg.remove_prefix(arg[1] == '-' ? 2 : 1);
  if (arg.empty()) return std::nullopt;
  FlagArg flag;
  const size_t eq = arg.find('=');
  flag.name = absl::StrReplaceAll(arg.substr(0, eq), {{"-", "_"}});
  if (eq != absl::string_view::npos) flag.value = std::string(arg.substr(eq + 1));
  return flag;
}

// A bool flag `name` as "--name", "--noname" or "--name=V": its value, or
// nullopt if `flag` is not that flag.
absl::StatusOr<std::optional<bool>> BoolFlag(const FlagArg& flag,
                                             absl::string_view name) {
  if (flag.name == absl::StrCat("no", name) && !flag.value.has_value()) {
    return std::optional<bool>(false);
  }
  if (flag.name != name) return std::optional<bool>();
  if (!flag.value.has_value()) return std::optional<bool>(true);
  bool value = false;
  if (!absl::SimpleAtob(*flag.value, &value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, ": not a bool: '", *flag.value, "'"));
  }
  return std::optional<bool>(value);
}

}  // namespace

absl::StatusOr<DaemonWorkerFlags> DaemonWorkerFlagsFrom(
    const std::vector<std::string>& args) {
  DaemonWorkerFlags flags;
  std::string calls_cpu = kCallsCpuByDefault;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") break;
    std::optional<FlagArg> flag = SplitFlag(args[i]);
    if (!flag.has_value()) continue;
    const std::pair<absl::string_view, bool*> bools[] = {
        {"direct_calls", &flags.direct_calls},
        {"calls_socket", &flags.calls_socket}};
    for (auto [name, target] : bools) {
      absl::StatusOr<std::optional<bool>> value = BoolFlag(*flag, name);
      if (!value.ok()) return value.status();
      if (value->has_value()) *target = **value;
    }
    const bool valued = flag->name == "python_home" || flag->name == "calls_cpu" ||
                        flag->name == "worker_intake_spin_us" ||
                        flag->name == "worker_intake_look_slack_us" ||
                        flag->name == "max_retained_results";
    if (!valued) continue;
    if (!flag->value.has_value()) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag->name, " needs a value"));
      }
      flag->value = args[++i];
    }
    if (flag->name == "python_home") {
      flags.python_home = *flag->value;
    } else if (flag->name == "calls_cpu") {
      calls_cpu = *flag->value;
    } else if (flag->name == "max_retained_results") {
      if (!absl::SimpleAtoi(*flag->value, &flags.max_retained_results)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--max_retained_results: not a number: '", *flag->value, "'"));
      }
    } else if (flag->name == "worker_intake_look_slack_us") {
      if (!absl::SimpleAtoi(*flag->value, &flags.worker_intake_look_slack_us)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--worker_intake_look_slack_us: not a number: '", *flag->value, "'"));
      }
    } else if (!absl::SimpleAtoi(*flag->value, &flags.worker_intake_spin_us)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--worker_intake_spin_us: not a number: '", *flag->value, "'"));
    }
  }
  absl::StatusOr<bool> off = CallsCpuPinsNothing(calls_cpu);
  if (!off.ok()) return off.status();
  flags.calls_cpu_off = *off;
  return flags;
}

}  // namespace agentix::sandbox
