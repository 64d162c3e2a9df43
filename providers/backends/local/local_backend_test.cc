// The local backend with real bubblewrap sandboxes (root, cgroup v1 on this
// machine). Each sandbox's bundle is a small bootstrap.sh that reports what
// it sees on stdout (the sandbox log) and, where the test needs an
// endpoint, listens on /run/agentix/agentix.sock with python3.
#include "providers/backends/local/local_backend.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "providers/core/errors.h"
#include "testing/status_matchers.h"

namespace agentix::providers::local {
namespace {

constexpr char kListen[] =
    "exec /usr/bin/python3 -c 'import socket,time\n"
    "s=socket.socket(socket.AF_UNIX); s.bind(\"/run/agentix/agentix.sock\"); s.listen()\n"
    "time.sleep(3600)'\n";

std::string MakeTemp(const std::string& base) {
  std::string path = base + "/lbXXXXXX";
  REQUIRE(mkdtemp(path.data()) != nullptr);
  return path;
}

// Per test process: cgroup paths are machine-wide, and Bazel may run
// several copies of this test at once.
const std::string& CgroupParent() {
  static const std::string* parent = new std::string(absl::StrCat("agentix-test-", getpid()));
  return *parent;
}

std::string TestTmp() { return getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp"; }

// A bundle directory whose bootstrap.sh runs `body`.
std::string MakeBundle(const std::string& body) {
  const std::string dir = MakeTemp(TestTmp());
  REQUIRE(mkdir((dir + "/nix").c_str(), 0755) == 0);
  REQUIRE(mkdir((dir + "/nix/runtime").c_str(), 0755) == 0);
  const std::string script = dir + "/nix/runtime/bootstrap.sh";
  std::ofstream(script) << "#!/bin/sh\n" << body;
  REQUIRE(chmod(script.c_str(), 0755) == 0);
  return dir;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

class Events : public EventSink {
 public:
  void OnObserved(const BackendRef& ref, const Observed& observed) override {
    absl::MutexLock lock(&mu_);
    seen_.emplace_back(ref.value, observed);
  }
  std::optional<Observed> WaitFor(const std::string& ref, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    std::optional<Observed> found;
    auto has = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      for (auto& [value, observed] : seen_) {
        if (value == ref) found = observed;
      }
      return found.has_value();
    };
    mu_.AwaitWithTimeout(absl::Condition(&has), timeout);
    return found;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<std::string, Observed>> seen_;
};

struct Fixture {
  explicit Fixture(bool seccomp = true, int64_t log_max_bytes = 16 << 20) {
    state = MakeTemp("/tmp");
    LocalBackendOptions options;
    options.state_dir = state + "/s";
    options.cgroup_parent = CgroupParent();
    options.seccomp = seccomp;
    options.token_flag = "--token-file";
    options.tmp_bytes = 8 << 20;
    options.log_max_bytes = log_max_bytes;
    auto made = NewLocalBackend(options);
    REQUIRE_OK(made.status());
    backend = std::move(*made);
    REQUIRE_OK(backend->Watch(&events));
  }
  ~Fixture() {
    // A failed test leaves no sandbox, cgroup or directory behind.
    if (auto owned = backend->ListOwned("test"); owned.ok()) {
      for (const BackendRef& ref : *owned) (void)backend->Destroy(ref, absl::ZeroDuration());
    }
    backend.reset();
    rmdir((state + "/s").c_str());
    rmdir(state.c_str());
  }
  LaunchSpec Spec(const std::string& id, const std::string& bundle) {
    LaunchSpec spec;
    spec.sandbox_id = id;
    spec.uid = id + "-uid";
    spec.instance = "test";
    spec.admin_token = "tok-" + id;
    spec.spec.mutable_bundle()->set_path(bundle);
    return spec;
  }
  // Polls ResolveEndpoint until the socket is real.
  absl::StatusOr<pb::Endpoint> WaitReady(const BackendRef& ref, absl::Duration timeout) {
    absl::Time deadline = absl::Now() + timeout;
    while (true) {
      auto endpoint = backend->ResolveEndpoint(ref);
      if (endpoint.ok() || endpoint.status().code() != absl::StatusCode::kUnavailable ||
          absl::Now() > deadline) {
        return endpoint;
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
  }
  std::string state;
  Events events;
  std::unique_ptr<Backend> backend;
};

std::string WaitLog(Backend& backend, const BackendRef& ref, const std::string& needle) {
  std::string tail;
  for (int i = 0; i < 500; ++i) {
    tail = backend.LogTail(ref, 1 << 16);
    if (absl::StrContains(tail, needle)) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return tail;
}

TEST_CASE("a sandbox comes up on a real socket, isolated, and Destroy leaves nothing") {
  Fixture f;
  const std::string bundle = MakeBundle(absl::StrCat(
      "echo \"args: $*\"\n"
      "echo \"token: $(cat \"$4\")\"\n"
      "echo \"env: $(env | sort | tr '\\n' ' ')\"\n"
      "echo \"procs: $(ls /proc | grep -c '^[0-9]')\"\n"
      "echo \"ifaces: $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' ')\"\n"
      "touch /etc/agentix-probe 2>/dev/null && echo root-writable || echo root-read-only\n"
      "echo x > /tmp/scratch && echo tmp-writable\n"
      "unshare -U true 2>/dev/null && echo unshare-allowed || echo unshare-refused\n"
      "echo isolation-done\n",
      kListen));
  const absl::Time start = absl::Now();
  REQUIRE_OK_AND_ASSIGN(BackendRef ref, f.backend->Launch(f.Spec("iso-1", bundle), absl::Now() + absl::Seconds(10)));
  const absl::Duration launched = absl::Now() - start;
  REQUIRE_OK_AND_ASSIGN(pb::Endpoint endpoint, f.WaitReady(ref, absl::Seconds(10)));
  const absl::Duration ready = absl::Now() - start;
  INFO("launch " << absl::FormatDuration(launched) << ", ready " << absl::FormatDuration(ready));
  CHECK(launched < absl::Milliseconds(150));
  const std::string socket = f.state + "/s/iso-1/run/agentix.sock";
  CHECK(endpoint.target() == "unix://" + socket);
  struct stat st;
  REQUIRE(lstat(socket.c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));

  const std::string log = WaitLog(*f.backend, ref, "isolation-done");
  INFO(log);
  CHECK(absl::StrContains(log, "args: --listen unix:///run/agentix/agentix.sock --token-file /proc/self/fd/4"));
  CHECK(absl::StrContains(log, "token: tok-iso-1\n"));
  CHECK(absl::StrContains(log, "AGENTIX_LISTEN=unix:///run/agentix/agentix.sock"));
  CHECK(absl::StrContains(log, "AGENTIX_SANDBOX_ID=iso-1"));
  CHECK(absl::StrContains(log, "HOME=/tmp"));
  CHECK_FALSE(absl::StrContains(log, "TEST_TMPDIR"));  // not providerd's environment
  // Only its own: the init, the shell and the listing itself (the
  // subshell, ls, grep); the host has hundreds.
  const size_t at = log.find("procs: ");
  REQUIRE(at != std::string::npos);
  int procs = 0;
  REQUIRE(absl::SimpleAtoi(log.substr(at + 7, log.find('\n', at) - at - 7), &procs));
  CHECK(procs >= 3);
  CHECK(procs <= 6);
  CHECK(absl::StrContains(log, "ifaces: lo \n"));
  CHECK(absl::StrContains(log, "root-read-only"));
  CHECK(absl::StrContains(log, "tmp-writable"));
  CHECK(absl::StrContains(log, "unshare-refused"));  // the seccomp filter
  CHECK(!Exists("/etc/agentix-probe"));

  REQUIRE_OK_AND_ASSIGN(Observed running, f.backend->Inspect(ref));
  CHECK(running.state == Observed::State::kRunning);
  REQUIRE_OK_AND_ASSIGN(auto owned, f.backend->ListOwned("test"));
  REQUIRE(owned.size() == 1);
  CHECK(owned[0].value == ref.value);
  REQUIRE_OK_AND_ASSIGN(auto others, f.backend->ListOwned("other"));
  CHECK(others.empty());

  const std::string record = Slurp(f.state + "/s/iso-1/state.json");
  CHECK(absl::StrContains(record, "\"pids\""));  // the default pids cgroup
  const std::string pids_cgroup = "/sys/fs/cgroup/pids/" + CgroupParent() + "/iso-1";
  CHECK(Slurp(pids_cgroup + "/pids.max") == "1024\n");

  // Every process of the tree, from the pids cgroup.
  const std::string listed = Slurp(pids_cgroup + "/cgroup.procs");
  std::vector<int> tree;
  for (absl::string_view pid : absl::StrSplit(listed, '\n', absl::SkipEmpty())) {
    int value;
    REQUIRE(absl::SimpleAtoi(pid, &value));
    tree.push_back(value);
  }
  CHECK(tree.size() >= 3);  // bwrap, its init, python3
  const absl::Time destroy = absl::Now();
  REQUIRE_OK(f.backend->Destroy(ref, absl::Seconds(2)));
  INFO("destroy " << absl::FormatDuration(absl::Now() - destroy));
  CHECK(!Exists(f.state + "/s/iso-1"));
  CHECK(!Exists(pids_cgroup));
  for (int pid : tree) {
    INFO("pid " << pid);
    CHECK(kill(pid, 0) != 0);
  }
  REQUIRE_OK_AND_ASSIGN(Observed gone, f.backend->Inspect(ref));
  CHECK(gone.state == Observed::State::kMissing);
  REQUIRE_OK(f.backend->Destroy(ref, absl::Seconds(1)));  // missing: OK
  auto event = f.events.WaitFor(ref.value, absl::Seconds(5));
  REQUIRE(event.has_value());
  CHECK(event->state == Observed::State::kExited);
  CHECK_FALSE(event->oom_killed);
}

TEST_CASE("without the seccomp filter the same unshare works (the filter is what refuses it)") {
  Fixture f(/*seccomp=*/false);
  const std::string bundle = MakeBundle(
      "unshare -U true && echo unshare-allowed || echo unshare-refused\nsleep 60\n");
  REQUIRE_OK_AND_ASSIGN(BackendRef ref, f.backend->Launch(f.Spec("nosec", bundle), absl::Now() + absl::Seconds(10)));
  CHECK(absl::StrContains(WaitLog(*f.backend, ref, "unshare-"), "unshare-allowed"));
  REQUIRE_OK(f.backend->Destroy(ref, absl::Milliseconds(100)));
}

TEST_CASE("a memory limit OOM-kills the sandbox: exit 137 and oom_killed") {
  Fixture f;
  const std::string bundle = MakeBundle(
      "exec /usr/bin/python3 -c 'a = bytearray(200 << 20); print(\"survived\")'\n");
  LaunchSpec spec = f.Spec("oom-1", bundle);
  spec.spec.mutable_resources()->set_memory_bytes(64 << 20);
  REQUIRE_OK_AND_ASSIGN(BackendRef ref, f.backend->Launch(spec, absl::Now() + absl::Seconds(10)));
  auto event = f.events.WaitFor(ref.value, absl::Seconds(20));
  REQUIRE(event.has_value());
  CHECK(event->state == Observed::State::kExited);
  CHECK(event->exit_code == std::optional<int>(137));
  CHECK(event->oom_killed);
  CHECK_FALSE(absl::StrContains(f.backend->LogTail(ref, 4096), "survived"));
  REQUIRE_OK_AND_ASSIGN(Observed observed, f.backend->Inspect(ref));
  CHECK(observed.oom_killed);
  CHECK(f.backend->ResolveEndpoint(ref).status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE_OK(f.backend->Destroy(ref, absl::Seconds(1)));
  // Nested under providerd's own memory cgroup, not at the hierarchy's root.
  CHECK(!Exists("/sys/fs/cgroup/memory/" + CgroupParent() + "/oom-1"));
}

TEST_CASE("a pids limit stops forks inside the sandbox") {
  Fixture f;
  const std::string bundle = MakeBundle(
      // dash exits when a fork fails: the loop runs in a subshell.
      "(i=0; while [ $i -lt 40 ]; do sleep 30 & i=$((i+1)); done) 2>/dev/null\n"
      "echo spawned; exec sleep 60\n");
  LaunchSpec spec = f.Spec("pids-1", bundle);
  spec.spec.mutable_resources()->set_pids(16);
  REQUIRE_OK_AND_ASSIGN(BackendRef ref, f.backend->Launch(spec, absl::Now() + absl::Seconds(10)));
  INFO(WaitLog(*f.backend, ref, "spawned"));
  const std::string cgroup = "/sys/fs/cgroup/pids/" + CgroupParent() + "/pids-1";
  CHECK(Slurp(cgroup + "/pids.max") == "16\n");
  // bwrap, its init, the shell and the sleeps that fit: never 40 sleeps.
  int current = 0;
  REQUIRE(absl::SimpleAtoi(absl::StripAsciiWhitespace(Slurp(cgroup + "/pids.current")), &current));
  CHECK(current >= 10);
  CHECK(current <= 16);
  const std::string events = Slurp(cgroup + "/pids.events");
  INFO(events);
  CHECK(absl::StartsWith(events, "max "));
  CHECK(events != "max 0\n");  // forks were refused at the cap
  REQUIRE_OK(f.backend->Destroy(ref, absl::Milliseconds(200)));
  CHECK(!Exists(cgroup));
}

TEST_CASE("a sandbox whose entry point exits is reported with its code and output") {
  Fixture f;
  const std::string bundle = MakeBundle("echo about to fail; exit 7\n");
  REQUIRE_OK_AND_ASSIGN(BackendRef ref, f.backend->Launch(f.Spec("exit-1", bundle), absl::Now() + absl::Seconds(10)));
  auto event = f.events.WaitFor(ref.value, absl::Seconds(10));
  REQUIRE(event.has_value());
  CHECK(event->exit_code == std::optional<int>(7));
  CHECK_FALSE(event->oom_killed);
  CHECK(f.backend->LogTail(ref, 100) == "about to fail\n");
  struct Collect : LogSink {
    std::string data;
    bool OnLogData(int64_t offset, absl::string_view chunk, bool) override {
      CHECK(offset == static_cast<int64_t>(data.size()));
      data.append(chunk.data(), chunk.size());
      return true;
    }
  } collect;
  REQUIRE_OK(f.backend->StreamLogs(ref, 0, /*follow=*/true, &collect));  // ends with the sandbox
  CHECK(collect.data == "about to fail\n");
  REQUIRE_OK(f.backend->Destroy(ref, absl::Seconds(1)));
}

TEST_CASE("a chatty sandbox's output is drained and capped; StreamLogs says what was rotated away") {
  Fixture f(/*seccomp=*/true, /*log_max_bytes=*/64 << 10);
  const std::string bundle = MakeBundle(
      "head -c 4194304 /dev/zero | tr '\\0' x\necho; echo the last line\n");
  REQUIRE_OK_AND_ASSIGN(BackendRef ref, f.backend->Launch(f.Spec("chat-1", bundle), absl::Now() + absl::Seconds(10)));
  auto event = f.events.WaitFor(ref.value, absl::Seconds(20));
  REQUIRE(event.has_value());
  CHECK(event->exit_code == std::optional<int>(0));  // never blocked on its pipe
  struct stat a, b;
  REQUIRE(stat((f.state + "/s/chat-1/sandbox.log").c_str(), &a) == 0);
  REQUIRE(stat((f.state + "/s/chat-1/sandbox.log.1").c_str(), &b) == 0);
  CHECK(a.st_size + b.st_size <= 64 << 10);
  CHECK(absl::EndsWith(f.backend->LogTail(ref, 100), "xx\nthe last line\n"));
  struct First : LogSink {
    int64_t offset = -1;
    bool truncated = false;
    bool OnLogData(int64_t at, absl::string_view, bool was_truncated) override {
      offset = at;
      truncated = was_truncated;
      return false;  // one chunk is enough
    }
  } first;
  REQUIRE_OK(f.backend->StreamLogs(ref, 0, /*follow=*/false, &first));
  CHECK(first.truncated);
  CHECK(first.offset == 4194304 + 15 - a.st_size - b.st_size);
  REQUIRE_OK(f.backend->Destroy(ref, absl::Seconds(1)));
}

TEST_CASE("bad specs are refused before anything is made") {
  Fixture f;
  const std::string bundle = MakeBundle(kListen);
  LaunchSpec spec = f.Spec("bad-1", f.state);  // a directory, not a bundle
  absl::Status status = f.backend->Validate(spec);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(ReasonOf(status) == kReasonNotABundle);
  CHECK(f.backend->Launch(spec, absl::Now() + absl::Seconds(5)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  spec.spec.mutable_bundle()->set_path(f.state + "/absent");
  CHECK(ReasonOf(f.backend->Validate(spec)) == kReasonNotABundle);
  spec = f.Spec("bad-1", bundle);
  spec.spec.set_image(f.state + "/absent-root");
  CHECK(f.backend->Validate(spec).code() == absl::StatusCode::kInvalidArgument);
  CHECK(ReasonOf(f.backend->Validate(spec)) == kReasonInvalidSpec);
  spec = f.Spec("bad-1", bundle);
  spec.spec.mutable_resources()->set_gpus(1);
  CHECK(f.backend->Validate(spec).code() == absl::StatusCode::kFailedPrecondition);
  spec = f.Spec("bad-1", bundle);
  spec.spec.mutable_network()->set_mode(pb::Network::BRIDGE);
  CHECK(f.backend->Validate(spec).code() == absl::StatusCode::kFailedPrecondition);
  spec = f.Spec("bad-1", bundle);
  spec.spec.mutable_network()->add_allow_egress_cidrs("10.0.0.0/8");
  CHECK(f.backend->Validate(spec).code() == absl::StatusCode::kFailedPrecondition);
  spec = f.Spec("bad-1", bundle);
  spec.spec.set_platform("linux/s390x");
  CHECK(f.backend->Validate(spec).code() == absl::StatusCode::kFailedPrecondition);
  spec.spec.set_platform("x86_64");
  CHECK(f.backend->Validate(spec).ok());
  spec.spec.mutable_resources()->set_nofile(int64_t{1} << 40);
  CHECK(f.backend->Validate(spec).code() == absl::StatusCode::kFailedPrecondition);
  spec = f.Spec("Bad_Id", bundle);
  CHECK(f.backend->Validate(spec).code() == absl::StatusCode::kInvalidArgument);
  CHECK(!Exists(f.state + "/s/bad-1"));
  REQUIRE_OK_AND_ASSIGN(auto owned, f.backend->ListOwned("test"));
  CHECK(owned.empty());
  REQUIRE_OK_AND_ASSIGN(auto caps, f.backend->Probe());
  CHECK(caps.memory_limit());
  CHECK(caps.pids_limit());
  CHECK_FALSE(caps.gpu());
  CHECK(absl::StrContains(caps.version(), "bubblewrap"));
}

TEST_CASE("a symlink planted as the socket is never an endpoint") {
  Fixture f;
  // A real socket elsewhere in the sandbox, and a symlink to it where the
  // daemon's socket belongs.
  const std::string bundle = MakeBundle(
      "exec /usr/bin/python3 -c 'import os,socket,time\n"
      "s=socket.socket(socket.AF_UNIX); s.bind(\"/run/agentix/real.sock\"); s.listen()\n"
      // Relative: followed from providerd's side it reaches that socket.
      "os.symlink(\"real.sock\", \"/run/agentix/agentix.sock\")\n"
      "print(\"planted\", flush=True); time.sleep(3600)'\n");
  REQUIRE_OK_AND_ASSIGN(BackendRef ref, f.backend->Launch(f.Spec("plant", bundle), absl::Now() + absl::Seconds(10)));
  REQUIRE(absl::StrContains(WaitLog(*f.backend, ref, "planted"), "planted"));
  for (int i = 0; i < 20; ++i) {
    absl::Status status = f.backend->ResolveEndpoint(ref).status();
    CHECK(status.code() == absl::StatusCode::kUnavailable);
    // The start's last word says why (it ends READY_TIMEOUT with it).
    CHECK(absl::StrContains(status.message(), "agentix.sock is not a socket but a symlink (not trusted)"));
    absl::SleepFor(absl::Milliseconds(5));
  }
  REQUIRE_OK(f.backend->Destroy(ref, absl::Milliseconds(100)));
}

TEST_CASE("scratch, nofile, cpu and HOST network reach the sandbox") {
  Fixture f;
  const std::string bundle = MakeBundle(
      "echo \"nofile: $(ulimit -n)\"\n"
      "echo \"tmp-kb: $(df -k /tmp | tail -1 | awk '{print $2}')\"\n"
      "echo \"ifaces: $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' ')\"\n"
      "echo reported; exec sleep 60\n");
  LaunchSpec spec = f.Spec("res-1", bundle);
  spec.spec.mutable_resources()->set_scratch_bytes(4 << 20);
  spec.spec.mutable_resources()->set_nofile(77);
  spec.spec.mutable_resources()->set_cpu_millis(250);
  spec.spec.mutable_network()->set_mode(pb::Network::HOST);
  REQUIRE_OK_AND_ASSIGN(BackendRef ref, f.backend->Launch(spec, absl::Now() + absl::Seconds(10)));
  const std::string log = WaitLog(*f.backend, ref, "reported");
  INFO(log);
  CHECK(absl::StrContains(log, "nofile: 77\n"));
  CHECK(absl::StrContains(log, "tmp-kb: 4096\n"));
  CHECK_FALSE(absl::StrContains(log, "ifaces: lo \n"));  // the host's interfaces
  const std::string record = Slurp(f.state + "/s/res-1/state.json");
  const size_t at = record.find("/sys/fs/cgroup/cpu/");
  REQUIRE(at != std::string::npos);
  const std::string cpu = record.substr(at, record.find('"', at) - at);
  CHECK(Slurp(cpu + "/cpu.cfs_quota_us") == "25000\n");
  CHECK(Slurp(cpu + "/cpu.cfs_period_us") == "100000\n");
  REQUIRE_OK(f.backend->Destroy(ref, absl::Milliseconds(100)));
  CHECK(!Exists(cpu));
}

TEST_CASE("bwrap failing before it starts the sandbox: START_FAILED with its output, nothing left") {
  const std::string state = MakeTemp("/tmp");
  LocalBackendOptions options;
  options.state_dir = state + "/s";
  options.cgroup_parent = CgroupParent();
  options.extra_bwrap_args = {"--no-such-bwrap-flag"};
  REQUIRE_OK_AND_ASSIGN(auto backend, NewLocalBackend(options));
  LaunchSpec spec;
  spec.sandbox_id = "fail-1";
  spec.spec.mutable_bundle()->set_path(MakeBundle(kListen));
  auto ref = backend->Launch(spec, absl::Now() + absl::Seconds(10));
  REQUIRE_FALSE(ref.ok());
  CHECK(ref.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(ReasonOf(ref.status()) == kReasonStartFailed);
  CHECK(absl::StrContains(ref.status().message(), "no-such-bwrap-flag"));
  CHECK(!Exists(state + "/s/fail-1"));
  CHECK(!Exists("/sys/fs/cgroup/pids/" + CgroupParent() + "/fail-1"));
  backend.reset();
  rmdir((state + "/s").c_str());
  rmdir(state.c_str());
}

TEST_CASE("Destroy of a half-made leftover removes the cgroups its id would have") {
  Fixture f;
  // As a providerd killed between making the directory and the cgroups
  // and recording them would leave it.
  REQUIRE(mkdir((f.state + "/s/half-1").c_str(), 0700) == 0);
  const std::string parent = "/sys/fs/cgroup/pids/" + CgroupParent();
  mkdir(parent.c_str(), 0755);
  REQUIRE(mkdir((parent + "/half-1").c_str(), 0755) == 0);
  REQUIRE_OK(f.backend->Destroy(BackendRef{"half-1:u"}, absl::Seconds(1)));
  CHECK(!Exists(f.state + "/s/half-1"));
  CHECK(!Exists(parent + "/half-1"));
  CHECK(!Exists(parent));  // the shared parent, once empty
}

TEST_CASE("a limit this machine cannot enforce: refused with require_limits, else run without") {
  const std::string state = MakeTemp("/tmp");
  const std::string no_cgroups = MakeTemp(TestTmp());  // nothing mounted here
  const std::string bundle = MakeBundle("echo started; exec sleep 60\n");
  for (bool require : {true, false}) {
    LocalBackendOptions options;
    options.state_dir = state + "/s";
    options.cgroup_root = no_cgroups;
    options.require_limits = require;
    REQUIRE_OK_AND_ASSIGN(auto backend, NewLocalBackend(options));
    REQUIRE_OK_AND_ASSIGN(auto caps, backend->Probe());
    CHECK_FALSE(caps.memory_limit());
    CHECK_FALSE(caps.pids_limit());
    CHECK(absl::StrContains(caps.detail(), "not mounted"));
    LaunchSpec spec;
    spec.sandbox_id = "nolimit";
    spec.spec.mutable_bundle()->set_path(bundle);
    spec.spec.mutable_resources()->set_memory_bytes(64 << 20);
    if (require) {
      absl::Status status = backend->Validate(spec);
      CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
      CHECK(ReasonOf(status) == kReasonLimitNotEnforceable);
      CHECK(absl::StrContains(status.message(), "memory limit not enforceable"));
      CHECK(backend->Launch(spec, absl::Now() + absl::Seconds(5)).status().code() ==
            absl::StatusCode::kFailedPrecondition);
      CHECK(!Exists(state + "/s/nolimit"));
    } else {
      REQUIRE_OK(backend->Validate(spec));
      REQUIRE_OK_AND_ASSIGN(BackendRef ref, backend->Launch(spec, absl::Now() + absl::Seconds(5)));
      CHECK(absl::StrContains(WaitLog(*backend, ref, "started"), "started"));
      CHECK_FALSE(absl::StrContains(Slurp(state + "/s/nolimit/state.json"), "\"memory\""));
      REQUIRE_OK(backend->Destroy(ref, absl::Milliseconds(100)));
      CHECK(!Exists(state + "/s/nolimit"));
    }
  }
  rmdir((state + "/s").c_str());
  rmdir(state.c_str());
}

TEST_CASE("a leftover of a SIGKILLed owner is listed and Destroy cleans it") {
  const std::string state = MakeTemp("/tmp");
  const std::string bundle = MakeBundle(kListen);
  (void)CgroupParent();  // the parent's pid names it, in the owner too
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  pid_t owner = fork();
  REQUIRE(owner >= 0);
  if (owner == 0) {
    close(ready[0]);
    LocalBackendOptions options;
    options.state_dir = state + "/s";
    options.cgroup_parent = CgroupParent();
    auto backend = NewLocalBackend(options);
    if (!backend.ok()) _exit(2);
    LaunchSpec spec;
    spec.sandbox_id = "left-1";
    spec.uid = "u1";
    spec.instance = "owner";
    spec.spec.mutable_bundle()->set_path(bundle);
    spec.spec.mutable_resources()->set_memory_bytes(256 << 20);
    auto ref = (*backend)->Launch(spec, absl::Now() + absl::Seconds(10));
    if (!ref.ok()) _exit(3);
    for (int i = 0; i < 1000 && !(*backend)->ResolveEndpoint(*ref).ok(); ++i) usleep(5000);
    (void)!write(ready[1], "x", 1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  char byte;
  REQUIRE(read(ready[0], &byte, 1) == 1);
  close(ready[0]);
  const std::string memory_cgroup = Slurp("/proc/self/cgroup");
  REQUIRE(kill(owner, SIGKILL) == 0);
  int status;
  REQUIRE(waitpid(owner, &status, 0) == owner);

  LocalBackendOptions options;
  options.state_dir = state + "/s";
  options.cgroup_parent = CgroupParent();
  REQUIRE_OK_AND_ASSIGN(auto backend, NewLocalBackend(options));
  REQUIRE_OK_AND_ASSIGN(auto owned, backend->ListOwned("owner"));
  REQUIRE(owned.size() == 1);
  CHECK(owned[0].value == "left-1:u1");
  const std::string record = Slurp(state + "/s/left-1/state.json");
  CHECK(absl::StrContains(record, "\"memory\""));
  const std::string pids_cgroup = "/sys/fs/cgroup/pids/" + CgroupParent() + "/left-1";
  CHECK(Exists(pids_cgroup));
  // --die-with-parent: the sandbox died with its owner.
  bool empty = false;
  for (int i = 0; i < 200 && !empty; ++i) {
    empty = Slurp(pids_cgroup + "/cgroup.procs").empty();
    if (!empty) usleep(10000);
  }
  CHECK(empty);
  REQUIRE_OK_AND_ASSIGN(Observed observed, backend->Inspect(owned[0]));
  CHECK(observed.state == Observed::State::kExited);
  // Something still alive in the leftover's cgroup is killed by Destroy.
  pid_t straggler = fork();
  REQUIRE(straggler >= 0);
  if (straggler == 0) {
    execl("/bin/sleep", "sleep", "60", nullptr);
    _exit(127);
  }
  std::ofstream(pids_cgroup + "/cgroup.procs") << straggler;
  REQUIRE(Slurp(pids_cgroup + "/cgroup.procs") == absl::StrCat(straggler, "\n"));
  REQUIRE_OK(backend->Destroy(owned[0], absl::Seconds(1)));
  REQUIRE(waitpid(straggler, &status, 0) == straggler);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  CHECK(!Exists(state + "/s/left-1"));
  CHECK(!Exists(pids_cgroup));
  REQUIRE_OK_AND_ASSIGN(auto after, backend->ListOwned("owner"));
  CHECK(after.empty());
  backend.reset();
  rmdir((state + "/s").c_str());
  rmdir(state.c_str());
}

}  // namespace
}  // namespace agentix::providers::local
