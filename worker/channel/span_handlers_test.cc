// The trace forwarder's on_span_start / on_span_end in C (span_handlers.h),
// against a stand-in forwarder that records what was called: the same steps
// as the driver's Python methods (worker/driver/traces.py).
#include <catch2/catch.hpp>
#include <string>

#include "worker/channel/channel_test_util.h"

namespace agentix::worker {
namespace {

// A forwarder stand-in: `sent` the _send_span calls (kind, span, call id,
// span type), `general` the general paths' calls, `by_class` the class
// methods' calls; `outcome` what _send_span returns (or raises, if an
// exception).
void DefineForwarder() {
  Py("import contextvars, threading\n"
     "call_id = contextvars.ContextVar('call', default='')\n"
     "class Busy(threading.local):\n"
     "    on = False\n"
     "class Forwarder:\n"
     "    def __init__(self, var=call_id):\n"
     "        self.sent, self.general, self.by_class = [], [], []\n"
     "        self.outcome = True\n"
     "        self.enabled = True\n"
     "        self._busy = Busy()\n"
     "        self._span_type = 'SpanType'\n"
     "        self._send_span = self.send\n"
     "        self.on_span_start, self.on_span_end = w.span_handlers(self, var)\n"
     "    def send(self, kind, span, cid, span_type):\n"
     "        self.sent.append((kind, span, cid, span_type))\n"
     "        if isinstance(self.outcome, BaseException):\n"
     "            raise self.outcome\n"
     "        return self.outcome\n"
     "    def _span_start_general(self, span):\n"
     "        self.general.append(('start', span))\n"
     "    def _span_end_general(self, span):\n"
     "        self.general.append(('end', span))\n"
     "    def on_span_start(self, span):\n"
     "        self.by_class.append(('start', span))\n"
     "    def on_span_end(self, span):\n"
     "        self.by_class.append(('end', span))\n");
}

TEST_CASE("span_handlers send, and take the general path for what send "
          "declines or fails on",
          "[channel]") {
  DefineForwarder();
  Py("f = Forwarder()\n"
     "assert f.on_span_start('s1') is None and f.on_span_end('s1') is None\n"
     "token = call_id.set('call-7')\n"
     "f.outcome = False\n"
     "f.on_span_start('s2')\n"
     "call_id.reset(token)\n"
     "f.outcome = ValueError('bad span')\n"
     "f.on_span_end('s3')\n"
     "f.outcome = 0\n"  // falsy, not False: declined too
     "f.on_span_start('s4')\n"
     "assert f.sent == [(3, 's1', '', 'SpanType'), (4, 's1', '', 'SpanType'),\n"
     "                  (3, 's2', 'call-7', 'SpanType'),\n"
     "                  (4, 's3', '', 'SpanType'), (3, 's4', '', 'SpanType')], f.sent\n"
     "assert f.general == [('start', 's2'), ('end', 's3'), ('start', 's4')], f.general\n"
     "assert f.by_class == []\n"
     "unset = contextvars.ContextVar('unset')\n"  // get() raises LookupError
     "u = Forwarder(unset)\n"
     "u.on_span_end('s5')\n"
     "assert u.sent == [] and u.general == [('end', 's5')], (u.sent, u.general)\n");
  // Not an Exception: it propagates, as from the Python method's try.
  CHECK(Raised("f.outcome = KeyboardInterrupt('stop'); f.on_span_start('s6')",
               "KeyboardInterrupt") == "stop");
  CHECK(PyEval("len(f.general)") == "3");
}

TEST_CASE("span_handlers do nothing while disabled or while the thread "
          "forwards through the general path",
          "[channel]") {
  DefineForwarder();
  Py("f = Forwarder()\n"
     "f.enabled = False\n"
     "f.on_span_start('s1'); f.on_span_end('s1')\n"
     "f.enabled = 0\n"  // falsy: disabled too
     "f.on_span_start('s2')\n"
     "f.enabled = 1\n"  // truthy: enabled
     "f.on_span_start('s3')\n"
     "f._busy.on = True\n"
     "f.on_span_start('s4'); f.on_span_end('s4')\n"
     "seen = []\n"
     "t = threading.Thread(target=lambda: (f.on_span_end('s5'), seen.append(1)))\n"
     "t.start(); t.join()\n"  // another thread: not busy
     "f._busy.on = False\n"
     "assert [s[1] for s in f.sent] == ['s3', 's5'], f.sent\n"
     "assert f.general == [] and f.by_class == [] and seen == [1]\n");
}

TEST_CASE("span_handlers leave a forwarder without the attributes they read "
          "to the class's methods",
          "[channel]") {
  DefineForwarder();
  Py("for missing in ('enabled', '_busy', '_send_span', '_span_type'):\n"
     "    f = Forwarder()\n"
     "    delattr(f, missing)\n"
     "    f.on_span_start('s'); f.on_span_end('s')\n"
     "    assert f.by_class == [('start', 's'), ('end', 's')], (missing, f.by_class)\n"
     "    assert f.sent == [] and f.general == [], missing\n");
  CHECK(Raised("w.span_handlers(Forwarder(), 'not a var')", "TypeError") ==
        "span_handlers(forwarder, call_id: ContextVar)");
  CHECK(Raised("w.span_handlers(Forwarder())", "TypeError") != kNoError);
}

}  // namespace
}  // namespace agentix::worker
