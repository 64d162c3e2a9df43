// The log handlers' `handle` in C (log_handles.h), against stand-in
// handlers that record what was called: the same steps as the driver's
// Python `handle` (worker/driver/logs.py, durable.py).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/channel/channel_test_util.h"

namespace agentix::worker {
namespace {

// A bridge stand-in: `sent` the send_log_record calls, `emitted` the emit
// calls, `by_class` the class handle's calls; `outcome` what send returns
// (or raises, if an exception).
void DefineBridge() {
  Py("import contextvars, logging\n"
     "call_id = contextvars.ContextVar('call', default='')\n"
     "STD, UNF = frozenset({'name'}), ('skipped',)\n"
     "class Bridge:\n"
     "    def __init__(self):\n"
     "        self.filters, self.sent, self.emitted, self.by_class = [], [], [], []\n"
     "        self.outcome = True\n"
     "        self.handle = w.bridge_handle(self, self.send, 'ctx', call_id, STD, UNF)\n"
     "    def send(self, record, context, cid, std, unf):\n"
     "        assert (context, std, unf) == ('ctx', STD, UNF)\n"
     "        self.sent.append((record, cid))\n"
     "        if isinstance(self.outcome, BaseException):\n"
     "            raise self.outcome\n"
     "        return self.outcome\n"
     "    def emit(self, record):\n"
     "        self.emitted.append(record)\n"
     "    def handle(self, record):\n"
     "        self.by_class.append(record)\n"
     "        return 'class'\n");
}

TEST_CASE("bridge_handle sends, and emits what send declines or fails on",
          "[channel]") {
  DefineBridge();
  Py("b = Bridge()\n"
     "assert b.handle('r1') is True\n"
     "token = call_id.set('call-7')\n"
     "b.outcome = False\n"
     "assert b.handle('r2') is True\n"
     "call_id.reset(token)\n"
     "b.outcome = ValueError('bad record')\n"
     "assert b.handle('r3') is True\n"
     "assert b.sent == [('r1', ''), ('r2', 'call-7'), ('r3', '')], b.sent\n"
     "assert b.emitted == ['r2', 'r3'] and b.by_class == [], b.emitted\n"
     "unset = contextvars.ContextVar('unset')\n"  // get() raises LookupError
     "u = Bridge()\n"
     "u.handle = w.bridge_handle(u, u.send, 'ctx', unset, STD, UNF)\n"
     "assert u.handle('r5') is True and u.sent == [] and u.emitted == ['r5']\n");
  // Not an Exception: it propagates, as from the Python handle's try.
  CHECK(Raised("b.outcome = KeyboardInterrupt('stop'); b.handle('r4')",
               "KeyboardInterrupt") == "stop");
  CHECK(PyEval("b.emitted") == "['r2', 'r3']");
}

TEST_CASE("bridge_handle leaves filtered handlers to the class's handle",
          "[channel]") {
  DefineBridge();
  Py("b = Bridge()\n"
     "b.filters = [logging.Filter('x')]\n"
     "assert b.handle('r1') == 'class'\n"
     "b.filters = ()\n"  // not a list: the class decides too
     "assert b.handle('r2') == 'class'\n"
     "assert b.by_class == ['r1', 'r2'] and b.sent == [] and b.emitted == []\n");
  CHECK(Raised("w.bridge_handle(b, b.send, 'ctx', 'not a var', STD, UNF)",
               "TypeError") != kNoError);
  CHECK(Raised("w.bridge_handle(b)", "TypeError") != kNoError);
}

// A durable stand-in writing to a temporary file by fd (write_log_line's
// write(2) path), with a lock that counts, and what emit / handleError /
// the class handle got.
void DefineDurable() {
  Py("import logging, os, tempfile\n"
     "class CountingLock:\n"
     "    def __init__(self):\n"
     "        self.held = 0\n"
     "        self.taken = 0\n"
     "    def acquire(self):\n"
     "        self.held += 1\n"
     "        self.taken += 1\n"
     "    def release(self):\n"
     "        self.held -= 1\n"
     "class Durable:\n"
     "    def __init__(self):\n"
     "        self.file = tempfile.TemporaryFile()\n"
     "        self.filters, self.lock = [], CountingLock()\n"
     "        self.formatter = self._line_formatter = object()\n"
     "        self.stream, self._mapped, self._fd = self.file, None, self.file.fileno()\n"
     "        self._context, self._rotates = 'ctx', True\n"
     "        self.maxBytes, self._size = 1 << 20, 0\n"
     "        self.emitted, self.errors, self.by_class = [], [], []\n"
     "        self.handle = w.durable_handle(self)\n"
     "    def emit(self, record):\n"
     "        assert self.lock.held == 1\n"
     "        self.emitted.append(record.msg)\n"
     "    def handleError(self, record):\n"
     "        assert self.lock.held == 1\n"
     "        self.errors.append(record.msg)\n"
     "    def handle(self, record):\n"
     "        assert self.lock is None or self.lock.held == 0\n"
     "        self.by_class.append(record.msg)\n"
     "        return 'class'\n"
     "    def text(self):\n"
     "        self.file.seek(0)\n"
     "        return self.file.read().decode()\n"
     "def rec(msg):\n"
     "    return logging.LogRecord('app.d', 20, 'p.py', 1, msg, None, None)\n");
}

TEST_CASE("durable_handle writes the default line under the lock and counts it",
          "[channel]") {
  DefineDurable();
  Py("d = Durable()\n"
     "assert d.handle(rec('first')) is True\n"
     "assert d.handle(rec('second')) is True\n"
     "lines = d.text().splitlines(keepends=True)\n"
     "assert [l.split('] ', 2)[2] for l in lines] == ['first\\n', 'second\\n'], lines\n"
     "assert ' [ctx] [app.d] ' in lines[0], lines\n"
     "assert d._size == len(d.text().encode()), d._size\n"
     "assert d.lock.taken == 2 and d.lock.held == 0\n"
     "assert d.emitted == d.errors == d.by_class == []\n");
}

TEST_CASE("durable_handle emits what needs the general path", "[channel]") {
  DefineDurable();
  Py("d = Durable()\n"
     "d.maxBytes = 10\n"  // no room: the rollover is emit's
     "assert d.handle(rec('too long for the room')) is True\n"
     "d.maxBytes = 1 << 20\n"
     "d._rotates = False\n"  // a FIFO: no room to check
     "assert d.handle(rec('unrotated')) is True\n"
     "d.formatter = logging.Formatter()\n"  // another format
     "assert d.handle(rec('formatted')) is True\n"
     "d.formatter = d._line_formatter\n"
     "r = rec('stack')\n"
     "r.stack_info = 'Stack (most recent call last):'\n"
     "assert d.handle(r) is True\n"
     "assert d.emitted == ['too long for the room', 'formatted', 'stack'], d.emitted\n"
     "assert d.text().endswith('] unrotated\\n') and d.lock.held == 0\n");
}

TEST_CASE("durable_handle reports a failed write and keeps errors it must",
          "[channel]") {
  DefineDurable();
  Py("d = Durable()\n"
     "d._fd = os.open(os.devnull, os.O_RDONLY)\n"  // write(2) fails: EBADF
     "assert d.handle(rec('unwritable')) is True\n"
     "os.close(d._fd)\n"
     "assert d.errors == ['unwritable'] and d.lock.held == 0, d.errors\n"
     "d._fd = d.file.fileno()\n"
     "def interrupted(record):\n"
     "    raise KeyboardInterrupt('stop')\n"
     "d.emit = interrupted\n"
     "d.formatter = None\n");
  // Raised from emit under the lock: it propagates, the lock released.
  CHECK(Raised("d.handle(rec('interrupted'))", "KeyboardInterrupt") == "stop");
  CHECK(PyEval("d.lock.held") == "0");
}

TEST_CASE("durable_handle leaves filtered and unexpected handlers to the class",
          "[channel]") {
  DefineDurable();
  Py("d = Durable()\n"
     "d.filters = [logging.Filter('x')]\n"
     "assert d.handle(rec('filtered')) == 'class'\n"
     "d.filters = []\n"
     "del d._rotates\n"  // a state it does not know: taken, released, left
     "assert d.handle(rec('no rotates')) == 'class'\n"
     "d._rotates = 1\n"
     "assert d.handle(rec('not a bool')) == 'class'\n"
     "d._rotates, d._size = True, 'many'\n"
     "assert d.handle(rec('odd size')) == 'class'\n"
     "d._size = 0\n"
     "d.lock = None\n"
     "assert d.handle(rec('no lock')) == 'class'\n"
     "assert d.by_class == ['filtered', 'no rotates', 'not a bool', 'odd size',\n"
     "                      'no lock'], d.by_class\n"
     "assert d.text() == '' and d.emitted == []\n");
}

}  // namespace
}  // namespace agentix::worker
