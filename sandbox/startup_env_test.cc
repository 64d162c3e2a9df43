#include "sandbox/startup_env.h"

#include <catch2/catch.hpp>

namespace agentix::sandbox {
namespace {

TEST_CASE("Start-up-only variables are recognised by name and family",
          "[startup_env]") {
  for (const char* name :
       {"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_BIND_NOW", "PYTHONPATH",
        "PYTHONHOME", "PYTHONHASHSEED", "LC_ALL", "LC_CTYPE", "LANG",
        "MALLOC_ARENA_MAX", "GLIBC_TUNABLES", "AGENTIX_LOG_LEVEL",
        "AGENTIX_LOG_DIR", "AGENTIX_WORKER_ID", "AGENTIX_WORKER_LARGE_BUFFERS",
        "SETUPTOOLS_USE_DISTUTILS"}) {
    CAPTURE(name);
    CHECK(IsStartupOnlyEnvVar(name));
  }
  for (const char* name : {"PATH", "HOME", "TZ", "TMPDIR", "OPENAI_API_KEY",
                           "AGENTIX_SANDBOX_ID", "MY_LD_PRELOAD", "LANGUAGE"}) {
    CAPTURE(name);
    CHECK_FALSE(IsStartupOnlyEnvVar(name));
  }
  CHECK(FirstStartupOnlyEnvVar({"A=1", "B=LD_PRELOAD=x", "LC_ALL=C"}) ==
        "LC_ALL");
  CHECK_FALSE(FirstStartupOnlyEnvVar({"A=1", "TZ=UTC"}).has_value());
}

}  // namespace
}  // namespace agentix::sandbox
