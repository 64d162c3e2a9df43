// The module table: helpers and constants.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "testing/status_matchers.h"
#include "worker/channel/channel_test_util.h"
#include "worker/ipc/frame.h"
#include "worker/ipc/io.h"
#include "worker/ipc/payload_area.h"

namespace agentix::worker {
namespace {

TEST_CASE("Module helpers: msgpack and constants", "[channel]") {
  EnsureChannelInterpreter();
  REQUIRE(PyEval("w.msgpack_loads(w.msgpack_dumps([[1, 'a'], {'k': b'v'}]))") ==
          "[[1, 'a'], {'k': b'v'}]");
  REQUIRE(PyEval("w.CHUNK_BYTES") == std::to_string(ipc::kChunkBytes));
  Py("w.log(0, 'debug line from the channel test')\n");
}

}  // namespace
}  // namespace agentix::worker
