#include "base/cpu_quota.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace agentix::base {
namespace {

// A fake /sys/fs/cgroup in a temporary directory.
class FakeRoot {
 public:
  FakeRoot() {
    std::string pattern = std::filesystem::temp_directory_path() / "agx-cgroup-XXXXXX";
    root_ = ::mkdtemp(pattern.data());
  }
  ~FakeRoot() { std::filesystem::remove_all(root_); }
  const std::string& root() const { return root_; }
  void Write(const std::string& relative, const std::string& text) {
    const std::filesystem::path path = root_ + "/" + relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }

 private:
  std::string root_;
};

TEST_CASE("No cpu controller files: no quota") {
  FakeRoot fake;
  auto quota = CpuQuota("0::/\n", fake.root());
  REQUIRE(quota.ok());
  CHECK_FALSE(quota->has_value());
}

TEST_CASE("cgroup v2: cpu.max of the process's cgroup or an ancestor") {
  FakeRoot fake;
  fake.Write("sandbox/cpu.max", "max 100000\n");
  fake.Write("sandbox/job/cpu.max", "max 100000\n");
  auto none = CpuQuota("0::/sandbox/job\n", fake.root());
  REQUIRE(none.ok());
  CHECK_FALSE(none->has_value());

  fake.Write("sandbox/cpu.max", "150000 100000\n");  // the parent's limit applies too
  auto parent = CpuQuota("0::/sandbox/job\n", fake.root());
  REQUIRE(parent.ok());
  REQUIRE(parent->has_value());
  CHECK(**parent == Approx(1.5));

  fake.Write("sandbox/job/cpu.max", "50000 100000\n");  // the tightest wins
  auto own = CpuQuota("0::/sandbox/job\n", fake.root());
  REQUIRE(own.ok());
  CHECK(**own == Approx(0.5));
}

TEST_CASE("cgroup v1: cfs quota of the cpu hierarchy; other controllers are ignored") {
  FakeRoot fake;
  const std::string cgroup = "4:memory:/m\n3:cpu,cpuacct:/box\n0::/\n";
  fake.Write("cpu,cpuacct/box/cpu.cfs_quota_us", "-1\n");
  fake.Write("cpu,cpuacct/box/cpu.cfs_period_us", "100000\n");
  fake.Write("memory/m/cpu.cfs_quota_us", "1000\n");  // not the cpu hierarchy
  auto none = CpuQuota(cgroup, fake.root());
  REQUIRE(none.ok());
  CHECK_FALSE(none->has_value());

  fake.Write("cpu,cpuacct/box/cpu.cfs_quota_us", "25000\n");
  auto set = CpuQuota(cgroup, fake.root());
  REQUIRE(set.ok());
  REQUIRE(set->has_value());
  CHECK(**set == Approx(0.25));

  // The v2 hierarchy mounted beside v1 ("unified") is read too.
  FakeRoot hybrid;
  hybrid.Write("unified/svc/cpu.max", "200000 100000\n");
  auto unified = CpuQuota("1:cpu:/\n0::/svc\n", hybrid.root());
  REQUIRE(unified.ok());
  CHECK(**unified == Approx(2.0));
}

TEST_CASE("Unreadable quota files and cgroup lines are typed errors naming them") {
  FakeRoot fake;
  fake.Write("box/cpu.max", "lots 100000\n");
  auto bad = CpuQuota("0::/box\n", fake.root());
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.status().message()).find("box/cpu.max") != std::string::npos);

  auto line = CpuQuota("garbage\n", fake.root());
  REQUIRE_FALSE(line.ok());
  CHECK(line.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("This process's own quota can be read") {
  // The value depends on the machine; reading it must not fail.
  CHECK(OwnCpuQuota().ok());
}

}  // namespace
}  // namespace agentix::base
