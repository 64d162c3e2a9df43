#include "sandbox/daemon_worker_args.h"

#include <catch2/catch.hpp>
#include <string>

#include "worker/channel/intake_baton.h"

namespace agentix::sandbox {
namespace {

using Args = std::vector<std::string>;

Args WorkerArgsOf(const Args& daemon_args) {
  absl::StatusOr<DaemonWorkerFlags> flags = DaemonWorkerFlagsFrom(daemon_args);
  REQUIRE(flags.ok());
  return WorkerArgsFor(*flags);
}

TEST_CASE("A daemon command line without these flags gets the daemon's defaults",
          "[worker_args]") {
  const Args none = WorkerArgsOf({"--listen", "unix:///tmp/s.sock", "--prestart_worker"});
  CHECK(none == WorkerArgsFor(DaemonWorkerFlags{}));
  if (kDirectCallsByDefault) {
    CHECK(none == Args{"--direct_calls"});
  } else {
    CHECK(none.empty());
  }
}

TEST_CASE("Each daemon flag gives the worker argument the daemon spawns with",
          "[worker_args]") {
  CHECK(WorkerArgsOf({"--python-home", "/r/python", "--nodirect_calls"}) ==
        Args{"--python-home=/r/python"});
  CHECK(WorkerArgsOf({"--python_home=/r/python", "--worker-intake-spin-us=7",
                      "--direct_calls"}) ==
        Args{"--python-home=/r/python", "--intake-spin-us=7", "--direct_calls"});
  // --calls_cpu=off pins nothing, the direct intake's follower included.
  CHECK(WorkerArgsOf({"--direct_calls", "--calls_cpu=off"}) ==
        Args{"--direct_calls", "--noavoid_holder_cpu"});
  CHECK(WorkerArgsOf({"-direct_calls", "--calls-cpu", "off"}) ==
        Args{"--direct_calls", "--noavoid_holder_cpu"});
  CHECK(WorkerArgsOf({"--direct_calls", "--calls_cpu=probe"}) == Args{"--direct_calls"});
  CHECK(WorkerArgsOf({"--direct_calls", "--calls_cpu=auto"}) == Args{"--direct_calls"});
  // The follower's look slack: on the command line only when not the default,
  // which must be the worker's own (the daemon keeps a copy; drift would
  // leave a worker with another slack than the daemon's flag says).
  CHECK(kWorkerIntakeLookSlackUsByDefault ==
        absl::ToInt64Microseconds(worker::IntakeBaton::kDefaultLookSlack));
  CHECK(WorkerArgsOf({"--worker_intake_look_slack_us=0", "--nodirect_calls"}) ==
        Args{"--intake-look-slack-us=0"});
  CHECK(WorkerArgsOf({"--worker-intake-look-slack-us",
                      std::to_string(kWorkerIntakeLookSlackUsByDefault),
                      "--nodirect_calls"})
            .empty());
  // Without the frame wire's socket nothing is handed over.
  CHECK(WorkerArgsOf({"--direct_calls", "--nocalls_socket"}).empty());
  CHECK(WorkerArgsOf({"--direct_calls", "--calls_socket=false"}).empty());
}

TEST_CASE("The last occurrence wins and nothing after a bare -- counts", "[worker_args]") {
  CHECK(WorkerArgsOf({"--direct_calls", "--direct_calls=false"}).empty());
  CHECK(WorkerArgsOf({"--nodirect_calls", "--direct-calls=yes"}) == Args{"--direct_calls"});
  CHECK(WorkerArgsOf({"--nodirect_calls", "--", "--direct_calls"}).empty());
  // Another flag's separate value is not a flag of ours.
  CHECK(WorkerArgsOf({"--nodirect_calls", "--venv", "/v", "--python-path", "/p"}).empty());
}

TEST_CASE("A value the daemon would refuse is an error", "[worker_args]") {
  CHECK(absl::IsInvalidArgument(DaemonWorkerFlagsFrom({"--direct_calls=maybe"}).status()));
  CHECK(absl::IsInvalidArgument(DaemonWorkerFlagsFrom({"--calls_cpu=lots"}).status()));
  CHECK(absl::IsInvalidArgument(DaemonWorkerFlagsFrom({"--calls_cpu"}).status()));
  CHECK(absl::IsInvalidArgument(
      DaemonWorkerFlagsFrom({"--worker_intake_spin_us=soon"}).status()));
  CHECK(absl::IsInvalidArgument(
      DaemonWorkerFlagsFrom({"--worker_intake_look_slack_us=late"}).status()));
}

TEST_CASE("CallsCpuPinsNothing reads --calls_cpu as the daemon does", "[worker_args]") {
  for (const char* off : {"", "off", " off "}) {
    INFO(off);
    REQUIRE(CallsCpuPinsNothing(off).ok());
    CHECK(*CallsCpuPinsNothing(off));
  }
  for (const char* placed : {"auto", "probe", " probe"}) {
    INFO(placed);
    REQUIRE(CallsCpuPinsNothing(placed).ok());
    CHECK_FALSE(*CallsCpuPinsNothing(placed));
  }
}

TEST_CASE("With direct calls the worker's options get the daemon's ledger", "[worker_args]") {
  WorkerOptions options;
  options.extra_args = {"--stale"};
  absl::StatusOr<DaemonWorkerFlags> flags =
      DaemonWorkerFlagsFrom({"--direct_calls", "--max_retained_results", "9000"});
  REQUIRE(flags.ok());
  SetWorkerOptionsFor(*flags, options);
  CHECK(options.extra_args == Args{"--direct_calls"});
  CHECK(options.ledger_call_slots == LedgerCallSlots(9000));
  CHECK(options.ledger_call_slots == 9000);

  flags = DaemonWorkerFlagsFrom({"--nodirect_calls", "--max_retained_results=9000"});
  REQUIRE(flags.ok());
  SetWorkerOptionsFor(*flags, options);
  CHECK(options.extra_args.empty());
  CHECK(options.ledger_call_slots == 0);

  flags = DaemonWorkerFlagsFrom({"--direct_calls"});
  REQUIRE(flags.ok());
  SetWorkerOptionsFor(*flags, options);
  CHECK(options.ledger_call_slots == LedgerCallSlots(kMaxRetainedResultsByDefault));
  CHECK(absl::IsInvalidArgument(
      DaemonWorkerFlagsFrom({"--max_retained_results=many"}).status()));
}

}  // namespace
}  // namespace agentix::sandbox
