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

TEST_CASE("map_file maps a file read-only for good", "[channel]") {
  EnsureChannelInterpreter();
  Py("import os\n"
     "d = os.environ['TEST_TMPDIR'] + '/map_file'\n"
     "os.makedirs(d, exist_ok=True)\n"
     "with open(d + '/data', 'wb') as f: f.write(b'abc' * 5000)\n"
     "open(d + '/empty', 'wb').close()\n"
     "v = w.map_file(d + '/data')\n");
  REQUIRE(PyEval("len(v), bytes(v[14994:]), v.readonly") ==
          "(15000, b'abcabc', True)");
  // Writing through the view is refused, not a crash.
  Py("try:\n    v[0] = 1\n    refused = False\n"
     "except TypeError:\n    refused = True\n");
  REQUIRE(PyEval("refused") == "True");
  REQUIRE(PyEval("w.map_file(d + '/missing')") == "None");
  REQUIRE(PyEval("w.map_file(d + '/empty')") == "None");
  Py("try:\n    w.map_file(d)\n    error = None\n"
     "except OSError as e:\n    error = str(e)\n");
  REQUIRE(PyEval("'not a regular file' in error") == "True");
  Py("try:\n    w.map_file(1)\n    error = None\n"
     "except TypeError:\n    error = 'TypeError'\n");
  REQUIRE(PyEval("error") == "TypeError");
}

}  // namespace
}  // namespace agentix::worker
