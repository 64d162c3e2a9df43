#include "sandbox/adopted_worker.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace agentix::sandbox {

std::string FormatAdoptFlag(const AdoptedWorker& worker) {
  std::string value = absl::StrCat("pid=", worker.pid, ",id=", worker.worker_id,
                                   ",channel=", worker.channel_fd, ",stderr=",
                                   worker.stderr_fd);
  if (worker.payload_fd >= 0) absl::StrAppend(&value, ",payload=", worker.payload_fd);
  return value;
}

absl::StatusOr<AdoptedWorker> ParseAdoptFlag(absl::string_view value) {
  AdoptedWorker worker;
  bool have_pid = false, have_channel = false, have_stderr = false;
  for (absl::string_view field : absl::StrSplit(value, ',')) {
    const size_t eq = field.find('=');
    const absl::string_view key = field.substr(0, eq);
    const absl::string_view text =
        eq == absl::string_view::npos ? absl::string_view() : field.substr(eq + 1);
    auto bad = [&] {
      return absl::InvalidArgumentError(
          absl::StrCat("--adopt_worker: bad field '", field, "' in '", value,
                       "' (expected pid=P,id=ID,channel=N,stderr=N[,payload=N])"));
    };
    if (eq == absl::string_view::npos) return bad();
    int number = -1;
    if (key == "id") {
      if (text.empty() || worker.worker_id.size() > 0) return bad();
      worker.worker_id = std::string(text);
      continue;
    }
    if (!absl::SimpleAtoi(text, &number)) return bad();
    if (key == "pid" && !have_pid && number > 0) {
      worker.pid = number;
      have_pid = true;
    } else if (key == "channel" && !have_channel && number > 2) {
      worker.channel_fd = number;
      have_channel = true;
    } else if (key == "stderr" && !have_stderr && number > 2) {
      worker.stderr_fd = number;
      have_stderr = true;
    } else if (key == "payload" && worker.payload_fd < 0 && number > 2) {
      worker.payload_fd = number;
    } else {
      return bad();
    }
  }
  if (!have_pid || !have_channel || !have_stderr || worker.worker_id.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--adopt_worker: '", value, "' lacks pid, id, channel or stderr"));
  }
  return worker;
}

}  // namespace agentix::sandbox
