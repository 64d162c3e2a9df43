// MappedLog against the file it maps: what a reader finds after a clean
// close, after a crash (a SIGKILLed process), on reopening, and in a forked
// child.
#include "worker/channel/mapped_log.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "testing/status_matchers.h"

namespace agentix::worker {
namespace {

std::string TempPath() {
  char dir[] = "/tmp/mapped_log_test.XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  return std::string(dir) + "/sandbox.log";
}

int OpenRw(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC,
                      0600);
  REQUIRE(fd >= 0);
  return fd;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// How many of this process's threads are named `name`.
int ThreadsNamed(const std::string& name) {
  int count = 0;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(opendir("/proc/self/task"), closedir);
  REQUIRE(dir != nullptr);
  while (dirent* entry = readdir(dir.get())) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + entry->d_name +
                       "/comm");
    std::string comm_name;
    std::getline(comm, comm_name);
    if (comm_name == name) ++count;
  }
  return count;
}

std::string Line(int i) {
  return "2026-12-02 17:30:00,000 [ctx] [bench] record " + std::to_string(i) +
         "\n";
}

TEST_CASE("A closed mapped log holds exactly the appended records") {
  const std::string path = TempPath();
  const int fd = OpenRw(path);
  {
    std::ofstream(path, std::ios::binary) << "earlier line\n";
  }
  REQUIRE_OK_AND_ASSIGN(std::unique_ptr<MappedLog> log, MappedLog::Open(fd));
  CHECK(log->Length() == 13);
  std::string expected = "earlier line\n";
  // Past two chunk boundaries, so the mapping grows and moves.
  for (int i = 0; expected.size() < 2 * MappedLog::kChunk + 100; ++i) {
    REQUIRE_OK(log->Append(Line(i)));
    expected += Line(i);
  }
  // A line longer than the window, and lines after it.
  const std::string long_line(3 * MappedLog::kChunk + 17, 'x');
  REQUIRE_OK(log->Append(long_line + "\n"));
  expected += long_line + "\n";
  REQUIRE_OK(log->Append(Line(-1)));
  expected += Line(-1);
  CHECK(log->Length() == expected.size());
  REQUIRE_OK(log->Close());
  CHECK(ReadAll(path) == expected);
  CHECK_FALSE(log->Append("late\n").ok());
  REQUIRE_OK(log->Close());  // again: nothing more
  close(fd);
}

TEST_CASE("A SIGKILLed writer leaves every appended record, then a NUL tail "
          "that the next Open trims") {
  const std::string path = TempPath();
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const int fd = open(path.c_str(), O_RDWR | O_APPEND | O_CREAT, 0600);
    auto log = MappedLog::Open(fd);
    if (!log.ok()) _exit(2);
    for (int i = 0; i < 1000; ++i) {
      if (!(*log)->Append(Line(i)).ok()) _exit(3);
    }
    const char byte = 1;
    if (write(ready[1], &byte, 1) != 1) _exit(4);
    pause();  // killed here, before any Close
    _exit(5);
  }
  close(ready[1]);
  char byte = 0;
  REQUIRE(read(ready[0], &byte, 1) == 1);
  close(ready[0]);
  kill(child, SIGKILL);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFSIGNALED(status));

  std::string expected;
  for (int i = 0; i < 1000; ++i) expected += Line(i);
  const std::string after_crash = ReadAll(path);
  // The records, then NULs up to the chunk the file had grown to.
  REQUIRE(after_crash.size() == MappedLog::kChunk);
  CHECK(after_crash.compare(0, expected.size(), expected) == 0);
  CHECK(after_crash.find_first_not_of('\0', expected.size()) ==
        std::string::npos);

  const int fd = OpenRw(path);
  REQUIRE_OK_AND_ASSIGN(std::unique_ptr<MappedLog> log, MappedLog::Open(fd));
  CHECK(log->Length() == expected.size());
  CHECK(ReadAll(path) == expected);  // trimmed at Open
  REQUIRE_OK(log->Append("next worker\n"));
  REQUIRE_OK(log->Close());
  CHECK(ReadAll(path) == expected + "next worker\n");
  close(fd);
}

TEST_CASE("A forked child neither writes into nor truncates its parent's "
          "mapped log") {
  const std::string path = TempPath();
  const int fd = OpenRw(path);
  REQUIRE_OK_AND_ASSIGN(std::unique_ptr<MappedLog> log, MappedLog::Open(fd));
  REQUIRE_OK(log->Append("parent 1\n"));
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const bool refused = !log->Append("child\n").ok();
    const bool closed = log->Close().ok();
    _exit(refused && closed ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  REQUIRE_OK(log->Append("parent 2\n"));
  REQUIRE_OK(log->Close());
  CHECK(ReadAll(path) == "parent 1\nparent 2\n");
  close(fd);
}

TEST_CASE("The same records land in the file with the pages faulted in "
          "ahead or not, a window taken back while being faulted in") {
  const bool prefault = GENERATE(true, false);
  CAPTURE(prefault);
  const std::string path = TempPath();
  const int fd = OpenRw(path);
  REQUIRE_OK_AND_ASSIGN(std::unique_ptr<MappedLog> log,
                        MappedLog::Open(fd, prefault));
  std::string expected;
  // Many windows; each Append right after a slide races the prefaulter
  // reading the same pages.
  for (int i = 0; expected.size() < 5 * MappedLog::kChunk + 3; ++i) {
    REQUIRE_OK(log->Append(Line(i)));
    expected += Line(i);
  }
  // A window longer than kChunk, then at once the next: the first is taken
  // back from the prefaulter mid-way.
  const std::string long_line(2 * MappedLog::kChunk + 5, 'y');
  REQUIRE_OK(log->Append(long_line + "\n"));
  expected += long_line + "\n";
  const std::string longer_line(4 * MappedLog::kChunk, 'z');
  REQUIRE_OK(log->Append(longer_line + "\n"));
  expected += longer_line + "\n";
  REQUIRE_OK(log->Append(Line(-2)));
  expected += Line(-2);
  REQUIRE_OK(log->Close());
  CHECK(ReadAll(path) == expected);
  close(fd);
}

TEST_CASE("A log closed just after its prefaulter starts holds its records") {
  const std::string path = TempPath();
  const int fd = OpenRw(path);
  std::string expected;
  for (int round = 0; round < 10; ++round) {
    REQUIRE_OK_AND_ASSIGN(std::unique_ptr<MappedLog> log, MappedLog::Open(fd));
    for (size_t appended = 0; appended <= MappedLog::kPrefaultAfter;) {
      const std::string line = Line(round);
      REQUIRE_OK(log->Append(line));
      expected += line;
      appended += line.size();
    }
    REQUIRE_OK(log->Close());  // the prefaulter likely still in the window
  }
  CHECK(ReadAll(path) == expected);
  close(fd);
}

TEST_CASE("A small log starts no prefaulting thread; a larger one starts "
          "one, which ends with the log") {
  const std::string path = TempPath();
  const int fd = OpenRw(path);
  REQUIRE(ThreadsNamed("agx-log-fault") == 0);
  REQUIRE_OK_AND_ASSIGN(std::unique_ptr<MappedLog> log, MappedLog::Open(fd));
  std::string expected;
  for (int i = 0; i < 100; ++i) {
    REQUIRE_OK(log->Append(Line(i)));
    expected += Line(i);
  }
  CHECK(ThreadsNamed("agx-log-fault") == 0);
  for (int i = 100; expected.size() <= MappedLog::kPrefaultAfter; ++i) {
    REQUIRE_OK(log->Append(Line(i)));
    expected += Line(i);
  }
  // The thread names itself as it starts.
  for (int tries = 0; tries < 500 && ThreadsNamed("agx-log-fault") == 0;
       ++tries) {
    usleep(10'000);
  }
  CHECK(ThreadsNamed("agx-log-fault") == 1);
  REQUIRE_OK(log->Close());
  log.reset();
  CHECK(ThreadsNamed("agx-log-fault") == 0);
  CHECK(ReadAll(path) == expected);
  close(fd);
}

TEST_CASE("Only a regular file is mapped") {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  CHECK_FALSE(MappedLog::Open(fds[1]).ok());
  close(fds[0]);
  close(fds[1]);
}

}  // namespace
}  // namespace agentix::worker
