#include "bundler/command.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "base/unique_fd.h"

extern char** environ;

namespace agentix::bundler {
namespace {

constexpr size_t kErrorTailBytes = 2000;

absl::Status MakePipe(base::UniqueFd& read_end, base::UniqueFd& write_end) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", strerror(errno)));
  }
  read_end.Reset(fds[0]);
  write_end.Reset(fds[1]);
  return absl::OkStatus();
}

std::string KeyOf(const std::string& entry) {
  return entry.substr(0, entry.find('='));
}

// Reads both pipes until both reach EOF, so neither child stream can fill
// up and block the child while we wait on the other.
void Drain(int out_fd, int err_fd, std::string& out, std::string& err) {
  pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  std::string* sinks[2] = {&out, &err};
  int open = 2;
  char buffer[65536];
  while (open > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        fds[i].fd = -1;
        --open;
      }
    }
  }
}

}  // namespace

absl::StatusOr<std::string> FindOnPath(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    if (access(program.c_str(), X_OK) == 0) return program;
    return absl::NotFoundError(absl::StrCat(program, " is not executable"));
  }
  const char* path = getenv("PATH");
  std::string search = path != nullptr ? path : "/usr/bin:/bin";
  for (absl::string_view dir : absl::StrSplit(search, ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/", program);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::NotFoundError(
      absl::StrCat("'", program, "' was not found on PATH (", search, ")"));
}

absl::StatusOr<CommandResult> RunCommand(
    const std::vector<std::string>& argv,
    const std::vector<std::string>& extra_env) {
  if (argv.empty()) return absl::InvalidArgumentError("empty command");
  AGX_ASSIGN_OR_RETURN(std::string program, FindOnPath(argv[0]));

  base::SpawnOptions spawn;
  spawn.path = program;
  spawn.argv = argv;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    bool overridden = false;
    for (const auto& extra : extra_env) {
      if (KeyOf(extra) == KeyOf(entry)) overridden = true;
    }
    if (!overridden) spawn.env.push_back(std::move(entry));
  }
  for (const auto& extra : extra_env) spawn.env.push_back(extra);

  base::UniqueFd out_read, out_write, err_read, err_write;
  AGX_RETURN_IF_ERROR(MakePipe(out_read, out_write));
  AGX_RETURN_IF_ERROR(MakePipe(err_read, err_write));
  spawn.fd_map = {{out_write.get(), 1}, {err_write.get(), 2}};
  AGX_ASSIGN_OR_RETURN(base::ChildProcess child,
                       base::ChildProcess::Spawn(spawn));
  out_write.Reset();
  err_write.Reset();

  CommandResult result;
  Drain(out_read.get(), err_read.get(), result.out, result.err);
  AGX_ASSIGN_OR_RETURN(result.exit, child.AwaitExit(absl::InfiniteDuration()));
  return result;
}

absl::StatusOr<CommandResult> RunCommandOrError(
    const std::vector<std::string>& argv,
    const std::vector<std::string>& extra_env) {
  AGX_ASSIGN_OR_RETURN(CommandResult result, RunCommand(argv, extra_env));
  if (result.ok()) return result;
  std::string tail = result.err.size() > kErrorTailBytes
                         ? result.err.substr(result.err.size() - kErrorTailBytes)
                         : result.err;
  return absl::FailedPreconditionError(
      absl::StrCat("`", absl::StrJoin(argv, " "), "` failed (",
                   result.exit.Describe(), "):\n", tail));
}

}  // namespace agentix::bundler
