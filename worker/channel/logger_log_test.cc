// The stdlib's Logger._log in C (logger_log.h): each call is made twice
// from the same line, once through the C _log and once through the
// stdlib's, and what the handlers got (every record attribute, in order,
// but the clock's three), what was raised and what reached lastResort must
// be the same. A handler notes whether _log had a Python frame on its
// stack, which says which path ran: the C one for the common calls, the
// stdlib's for what it declines.
#include <catch2/catch.hpp>
#include <string>

#include "worker/channel/channel_test_util.h"

namespace agentix::worker {
namespace {

void DefineBoth() {
  Py("import logging, sys, threading\n"
     "STDLIB = w.install_logger_log(logging)\n"
     "OURS = {name: logging.Logger.__dict__[name] for name in STDLIB}\n"
     "assert sorted(OURS) == ['_log', 'critical', 'debug', 'error', 'info',\n"
     "                        'log', 'warning'], OURS\n"
     "assert all(type(m).__name__ == 'method_descriptor' for m in "
     "OURS.values())\n"
     "assert w.install_logger_log(logging) == STDLIB\n"
     "import inspect\n"  // the same signatures as the stdlib's
     "bound = logging.getLogger('signatures')\n"
     "for name, m in STDLIB.items():\n"
     "    ours, theirs = (list(inspect.signature(f).parameters.values())\n"
     "                    for f in (OURS[name], m))\n"  // but self
                                                        // positional-only
     "    assert [(p.name, p.default) for p in ours] == [\n"
     "        (p.name, p.default) for p in theirs], name\n"
     "    assert (inspect.signature(getattr(bound, name))\n"
     "            == inspect.signature(m.__get__(bound))), name\n"
     "CODES = {m.__code__: name for name, m in STDLIB.items()}\n"
     "def stack_names():\n"
     "    f, names = sys._getframe(), []\n"  // the stdlib methods' frames
     "    while f is not None:\n"
     "        if f.f_code in CODES:\n"
     "            names.append(CODES[f.f_code])\n"
     "        f = f.f_back\n"
     "    return names\n"
     "def use(methods):\n"
     "    for name, m in methods.items():\n"
     "        setattr(logging.Logger, name, m)\n"
     "class Keep(logging.Handler):\n"
     "    def __init__(self, level=0):\n"
     "        super().__init__(level)\n"
     "        self.got, self.python = [], []\n"
     "    def emit(self, record):\n"
     "        d = dict(vars(record))\n"
     "        for k in ('created', 'msecs', 'relativeCreated'):\n"
     "            d.pop(k)\n"
     "        d['thread'] = d['thread'] == threading.get_ident()\n"  // runs'
                                                                     // threads
                                                                     // differ
     "        if str(d['threadName']).startswith('Dummy-'):\n"  // numbered per
                                                                // run
     "            d['threadName'] = 'Dummy'\n"
     "        if d['exc_info']:\n"  // each run raises its own exception
     "            t, v, tb = d['exc_info']\n"
     "            d['exc_info'] = (t, repr(v), tb.tb_lineno)\n"
     "        self.got.append((type(self).__name__, list(vars(record)), d))\n"
     "        self.python.append(stack_names())\n"
     "KEEPS = []\n"
     "def keep(logger, level=0):\n"
     "    h = Keep(level)\n"
     "    logger.addHandler(h)\n"
     "    KEEPS.append(h)\n"
     "    return h\n"
     "def both(call):\n"
     "    \"\"\"call() through the C methods, then the stdlib's (the same\n"
     "    line): what the handlers got and what was raised must be the same.\n"
     "    Returns those and, per record, the stdlib methods' Python frames\n"
     "    in the C run (some where it declined).\"\"\"\n"
     "    runs = []\n"
     "    for methods in (OURS, STDLIB):\n"
     "        for h in KEEPS:\n"
     "            h.got.clear(); h.python.clear()\n"
     "        use(methods)\n"
     "        try:\n"
     "            call()\n"
     "            raised = None\n"
     "        except Exception as e:\n"
     "            raised = repr(e)\n"
     "        finally:\n"
     "            use(OURS)\n"
     "        runs.append(([h.got[:] for h in KEEPS], raised,\n"
     "                     [p for h in KEEPS for p in h.python]))\n"
     "    assert runs[0][:2] == runs[1][:2], runs\n"
     "    assert all('_log' in p for p in runs[1][2]), runs[1][2]\n"
     "    return runs[0]\n"
     "def c_path(call):\n"
     "    got, raised, python = both(call)\n"
     "    assert python and not any(python), (python, got, raised)\n"
     "    return got, raised\n"
     "def declined(call):\n"
     "    got, raised, python = both(call)\n"
     "    assert python and all('_log' in p for p in python), (python, got, "
     "raised)\n"
     "    return got, raised\n");
}

// A fresh logger tree `name` (child of `name`'s parent `base`) with a Keep
// on the child and one on the parent.
void Tree(const std::string& base) {
  DefineBoth();
  Py("KEEPS.clear()\n"
     "parent = logging.getLogger('" +
     base +
     "')\n"
     "log = logging.getLogger('" +
     base +
     ".child')\n"
     "parent.propagate = False\n"
     "parent.setLevel(1)\n"
     "child_keep, parent_keep = keep(log), keep(parent)\n");
}

TEST_CASE("The C _log makes the stdlib's record, caller and all",
          "[logger_log]") {
  Tree("t1");
  Py("got, _ = c_path(lambda: log.info('m %d %s', 1, 'two'))\n"
     "_, keys, d = got[0][0]\n"
     "assert d['funcName'] == '<lambda>' and d['filename'] == '<string>', d\n"
     "assert d['levelname'] == 'INFO' and d['args'] == (1, 'two'), d\n"
     "assert len(got[0]) == 1 and len(got[1]) == 1, got\n"  // child, then
                                                            // parent
     "c_path(lambda: log.warning('m', stacklevel=2))\n"
     "c_path(lambda: log.error('m', stacklevel=3))\n"
     "c_path(lambda: log.error('m', stacklevel=10**6))\n"  // the outermost
                                                           // frame
     "c_path(lambda: log.log(25, 'm %(a)s', {'a': 1}))\n"
     "c_path(lambda: logging.LoggerAdapter(log, {}).info('adapted'))\n"
     "c_path(lambda: log._log(20, 'm %s', ('a',), None, None, False, 2))\n"
     "c_path(lambda: log._log(level=20, msg='m', args=(), stacklevel=1))\n"
     "c_path(lambda: log.info('m', extra={'k': 1}, exc_info=False))\n"
     "got, _ = c_path(lambda: log.info('m', extra={'k': [1]}))\n"
     "assert got[0][0][2]['k'] == [1], got\n"
     "def from_thread():\n"
     "    t = threading.Thread(target=lambda: log.info('thread'), name='th')\n"
     "    t.start(); t.join()\n"
     "c_path(from_thread)\n");
  // importlib's bootstrap frames are skipped as logging's own are.
  Py("ns = {}\n"
     "exec(compile('def via(log):\\n    log.info(\"boot\", stacklevel=2)\\n',\n"
     "             '/x/importlib/_bootstrap_fake.py', 'exec'), ns)\n"
     "got, _ = c_path(lambda: ns['via'](log))\n"
     "assert got[0][0][2]['funcName'] == 'both', got\n"  // via's frame skipped
     "exec(compile('def via(log):\\n    log.info(\"plain\", "
     "stacklevel=2)\\n',\n"
     "             '/x/importlib/fake.py', 'exec'), ns)\n"
     "got, _ = c_path(lambda: ns['via'](log))\n"
     "assert got[0][0][2]['funcName'] == '<lambda>', got\n"
     "got, _ = c_path(lambda: ns['via'](log) or log.info('direct'))\n");
}

TEST_CASE("The C _log leaves what it does not do to the stdlib's",
          "[logger_log]") {
  Tree("t2");
  Py("def raising():\n"
     "    try:\n"
     "        raise ValueError('x')\n"
     "    except ValueError as e:\n"
     "        log.error('a', exc_info=True)\n"
     "        log.error('b', exc_info=e)\n"
     "declined(raising)\n"
     "declined(lambda: log.info('m', stack_info=True))\n"
     "declined(lambda: log.info('m', stacklevel=0))\n"
     "declined(lambda: log.info('m', stacklevel=True))\n"
     "declined(lambda: log.info('m', exc_info=0))\n");
  // Wrong arguments: the stdlib's _log says what is wrong.
  Py("_, raised = both(lambda: log._log(20, 'm'))[:2]\n"
     "assert 'missing 1 required positional argument' in raised, raised\n"
     "_, raised = both(lambda: log._log(20, 'm', (), bogus=1))[:2]\n"
     "assert 'unexpected keyword argument' in raised, raised\n"
     "_, raised = both(lambda: log._log(20, 'm', (), level=20))[:2]\n"
     "assert 'multiple values' in raised, raised\n");
  // The level methods: keywords naming their parameters and non-int levels
  // get the stdlib's method; isEnabledFor's cache, logging.disable and the
  // logger's level decide as in the stdlib.
  Py("_, raised = both(lambda: log.log('20', 'm'))[:2]\n"
     "assert raised == \"TypeError('level must be an integer')\", raised\n"
     "_, raised = both(lambda: log.info('m', msg='x'))[:2]\n"
     "assert 'multiple values' in raised, raised\n"
     "_, raised = both(lambda: log.info('m', level=5))[:2]\n"
     "assert 'multiple values' in raised, raised\n"
     // The stdlib's info, which then calls the C _log.
     "got, _, python = both(lambda: log.info(msg='keyword'))\n"
     "assert got[0][0][2]['msg'] == 'keyword' and python == [['info']] * 2, "
     "python\n"
     "c_path(lambda: log.fatal('fatal') or logging.Logger.info(log, "
     "'unbound'))\n"
     "def exception():\n"
     "    try:\n"
     "        raise KeyError('k')\n"
     "    except KeyError:\n"
     "        log.exception('caught')\n"
     "declined(exception)\n"
     "log.setLevel(logging.WARNING)\n"  // clears the cache: isEnabledFor
                                        // refills it
     "got, _ = c_path(lambda: log.info('no') or log.warning('yes') or "
     "log.log(45, 'yes'))\n"
     "assert [g[2]['msg'] for g in got[0]] == ['yes', 'yes'], got\n"
     "assert log._cache == {20: False, 30: True, 45: True}, log._cache\n"
     "log.setLevel(logging.NOTSET)\n"
     "logging.disable(logging.ERROR)\n"
     "got, _ = c_path(lambda: log.error('off') or log.critical('on'))\n"
     "logging.disable(logging.NOTSET)\n"
     "assert [g[2]['msg'] for g in got[0]] == ['on'], got\n"
     "log.isEnabledFor = lambda level: level >= 40\n"
     "got, _, python = both(lambda: log.warning('no') or log.error('yes'))\n"
     "assert [g[2]['msg'] for g in got[0]] == ['yes'], got\n"
     "assert python == [['error']] * 2, python\n"
     "del log.isEnabledFor\n"
     "class Enabled(logging.Logger):\n"
     "    def isEnabledFor(self, level):\n"
     "        return True\n"
     "enabled = Enabled('t2.child.enabled')\n"
     "enabled.parent = log\n"
     "got, _ = both(lambda: enabled.debug('debug'))[:2]\n"
     "assert [g[2]['msg'] for g in got[0]] == ['debug'], got\n");
  // A class or an instance with its own findCaller / makeRecord / handle /
  // filter / callHandlers gets the stdlib's _log, which calls them.
  Py("class Own(logging.Logger):\n"
     "    def findCaller(self, stack_info=False, stacklevel=1):\n"
     "        return ('own.py', 1, 'own', None)\n"
     "class Plain(logging.Logger):\n"
     "    def extra_method(self):\n"
     "        pass\n"
     "own, plain = Own('t2.child.own'), Plain('t2.child.plain')\n"
     "own.parent = plain.parent = log\n"
     "got, _ = declined(lambda: own.info('m'))\n"
     "assert got[0][0][2]['filename'] == 'own.py', got\n"
     "c_path(lambda: plain.info('m'))\n"
     "for name in ('findCaller', 'makeRecord', 'handle', 'filter', "
     "'callHandlers'):\n"
     "    setattr(plain, name, getattr(plain, name))\n"
     "    declined(lambda: plain.info('m'))\n"
     "    delattr(plain, name)\n"
     "c_path(lambda: plain.info('m'))\n"
     "saved = logging.Logger.makeRecord\n"
     "logging.Logger.makeRecord = lambda self, *a: saved(self, *a)\n"
     "try:\n"
     "    declined(lambda: log.info('patched class'))\n"
     "finally:\n"
     "    logging.Logger.makeRecord = saved\n"
     "c_path(lambda: log.info('restored'))\n");
  // logging._srcfile: None (no caller looked up, as in the stdlib) or
  // another file (the stdlib's walk).
  Py("saved = logging._srcfile\n"
     "try:\n"
     "    logging._srcfile = None\n"
     "    got, _ = c_path(lambda: log.info('m'))\n"
     "    assert got[0][0][2]['pathname'] == '(unknown file)', got\n"
     "    assert got[0][0][2]['lineno'] == 0, got\n"
     "    logging._srcfile = ''\n"
     "    c_path(lambda: log.info('m'))\n"
     "    logging._srcfile = '<string>'\n"
     "    got, _ = declined(lambda: log.info('m'))\n"
     "    assert got[0][0][2]['funcName'] == '_log', got\n"
     "finally:\n"
     "    logging._srcfile = saved\n"
     "saved = logging.currentframe\n"
     "try:\n"
     "    logging.currentframe = lambda: sys._getframe(1)\n"
     "    declined(lambda: log.info('m'))\n"
     "finally:\n"
     "    logging.currentframe = saved\n");
}

TEST_CASE("The C _log hands the record on as Logger.handle does",
          "[logger_log]") {
  Tree("t3");
  // The logger's own filters and disabled flag.
  Py("log.addFilter(lambda r: r.msg != 'drop')\n"
     "got, _ = c_path(lambda: log.info('keep') or log.info('drop'))\n"
     "assert [g[2]['msg'] for g in got[0]] == ['keep'], got\n"
     "log.filters.clear()\n"
     "log.addFilter(logging.Filter('other'))\n"
     "got, _ = both(lambda: log.info('filtered'))[:2]\n"
     "assert got == [[], []], got\n"
     "log.filters.clear()\n"
     "log.disabled = True\n"
     "got, _ = both(lambda: log._log(20, 'off', ()))[:2]\n"
     "assert got == [[], []], got\n"
     "log.disabled = False\n");
  // Handler levels, propagation, a handler list changed while it is walked,
  // a record changed by a handler, a tuple of handlers, a raising handler.
  Py("child_keep.setLevel(logging.WARNING)\n"
     "got, _ = c_path(lambda: log.info('m') or log.warning('w'))\n"
     "assert [len(g) for g in got] == [1, 2], got\n"
     "child_keep.setLevel(0)\n"
     "class Remove:\n"
     "    level = 0\n"
     "    def handle(self, record):\n"
     "        log.removeHandler(self)\n"
     "        record.levelno = 5\n"
     "        return True\n"
     "def changing():\n"
     "    log.handlers.insert(0, Remove())\n"
     "    log.info('changing')\n"
     "    log.info('after')\n"
     "parent_keep.setLevel(10)\n"  // the changed record's levelno 5 is below
     "got, _ = c_path(changing)\n"
     "parent_keep.setLevel(0)\n"
     // Remove went first and took itself out: the walk skipped child_keep.
     "assert [[g[2]['msg'] for g in k] for k in got] == [['after'], "
     "['after']], got\n"
     "log.propagate = False\n"
     "got, _ = c_path(lambda: log.info('local'))\n"
     "assert [len(g) for g in got] == [1, 0], got\n"
     "log.propagate = True\n"
     "log.handlers = (child_keep,)\n"
     "c_path(lambda: log.info('tuple'))\n"
     "log.handlers = [child_keep]\n"
     "class Boom:\n"
     "    level = 0\n"
     "    def handle(self, record):\n"
     "        raise ValueError('boom')\n"
     "log.handlers.insert(0, Boom())\n"
     "_, raised = both(lambda: log.info('boom'))[:2]\n"
     "assert raised == \"ValueError('boom')\", raised\n"
     "del log.handlers[0]\n");
  // No handler anywhere: lastResort, through the stdlib's callHandlers.
  Py("alone = logging.getLogger('t3alone')\n"
     "alone.propagate = False\n"
     "saved = logging.lastResort\n"
     "last = logging.lastResort = Keep(logging.WARNING)\n"
     "KEEPS.append(last)\n"
     "try:\n"
     "    got, _ = c_path(lambda: alone.warning('nobody') or "
     "alone.info('quiet'))\n"
     "finally:\n"
     "    logging.lastResort = saved\n"
     "    KEEPS.remove(last)\n"
     "assert got[-1][0][2]['msg'] == 'nobody' and len(got[-1]) == 1, got\n");
  // Another record factory, a logger class set with setLoggerClass, the
  // root logger through logging's module functions.
  Py("saved = logging.getLogRecordFactory()\n"
     "def factory(*args, **kwargs):\n"
     "    record = saved(*args, **kwargs)\n"
     "    record.tagged = True\n"
     "    return record\n"
     "logging.setLogRecordFactory(factory)\n"
     "try:\n"
     "    got, _ = c_path(lambda: log.info('tagged'))\n"
     "    assert got[0][0][2]['tagged'] is True, got\n"
     "finally:\n"
     "    logging.setLogRecordFactory(saved)\n"
     "class Counting(logging.Logger):\n"
     "    def callHandlers(self, record):\n"
     "        record.counted = True\n"
     "        super().callHandlers(record)\n"
     "logging.setLoggerClass(Counting)\n"
     "try:\n"
     "    counting = logging.getLogger('t3.child.counting')\n"
     "finally:\n"
     "    logging.setLoggerClass(logging.Logger)\n"
     "got, _ = declined(lambda: counting.info('counted'))\n"
     "assert got[0][0][2]['counted'] is True, got\n"
     "root = logging.getLogger()\n"
     "root_keep = keep(root)\n"
     "try:\n"
     "    got, _ = c_path(lambda: logging.warning('root %s', 'w'))\n"
     "    assert got[-1][0][2]['name'] == 'root', got\n"
     "finally:\n"
     "    root.removeHandler(root_keep)\n"
     "    KEEPS.remove(root_keep)\n");
}

TEST_CASE("The C methods find the stdlib's caller wherever Python logs from",
          "[logger_log]") {
  Tree("t4");
  // A thread whose first frame is the C method (no Python frame at all):
  // the stdlib's caller is its own level method's frame (the outermost),
  // so the C level method leaves such a call to it.
  Py("import _thread, time\n"
     "def no_frame(method, *args, **kwargs):\n"
     "    def call():\n"
     "        before = len(child_keep.got)\n"
     "        _thread.start_new_thread(method, args, kwargs)\n"
     "        deadline = time.monotonic() + 10\n"
     "        while len(child_keep.got) == before:\n"
     "            assert time.monotonic() < deadline\n"
     "            time.sleep(0.001)\n"
     "        time.sleep(0.01)\n"  // the thread leaves the handlers
     "    return call\n"
     "got, _ = both(no_frame(log.info, 'first frame'))[:2]\n"
     "assert got[0][0][2]['funcName'] == 'info', got\n"
     "got, _ = both(no_frame(log.log, 25, 'first frame'))[:2]\n"
     "assert got[0][0][2]['funcName'] == 'log', got\n"
     "both(no_frame(log.warning, 'deep', stacklevel=5))\n"
     "both(no_frame(log._log, 20, 'direct', ()))\n"
     "both(no_frame(logging.LoggerAdapter(log, {}).info, 'adapter'))\n");
  // Module top level, generators, coroutines, comprehensions, class
  // bodies, __del__, a thread's own first frame with stacklevel past it.
  Py("ns = {'log': log}\n"
     "exec(compile('log.info(\"top\")\\nlog.info(\"top 2\", "
     "stacklevel=2)\\n',\n"
     "             '/x/top_module.py', 'exec'), ns)\n"
     "top = compile('log.info(\"top\")\\n', '/x/top_module.py', 'exec')\n"
     "got, _ = c_path(lambda: exec(top, ns))\n"
     "assert got[0][0][2]['funcName'] == '<module>', got\n"
     "assert got[0][0][2]['module'] == 'top_module', got\n"
     "def gen():\n"
     "    log.info('in generator')\n"
     "    yield 1\n"
     "    log.info('resumed', stacklevel=2)\n"
     "    yield 2\n"
     "got, _ = c_path(lambda: list(gen()))\n"
     "assert [g[2]['funcName'] for g in got[0]] == ['gen', '<lambda>'], got\n"
     "async def coro():\n"
     "    log.info('in coroutine')\n"
     "    log.info('awaited', stacklevel=2)\n"
     "import asyncio\n"
     "c_path(lambda: asyncio.run(coro()))\n"
     "got, _ = c_path(lambda: [log.info('comp %d', i) for i in range(2)])\n"
     "assert got[0][0][2]['funcName'] == '<listcomp>', got\n"
     "c_path(lambda: {log.info('set %d', i) for i in range(1)})\n"
     "c_path(lambda: list(log.info('genexp %d', i) for i in range(1)))\n"
     "def class_body():\n"
     "    class Body:\n"
     "        log.info('class body')\n"
     "got, _ = c_path(class_body)\n"
     "assert got[0][0][2]['funcName'] == 'Body', got\n"
     "class Dying:\n"
     "    def __del__(self):\n"
     "        log.warning('del')\n"
     "got, _ = c_path(lambda: Dying())\n"
     "assert got[0][0][2]['funcName'] == '__del__', got\n"
     "def thread_first(stacklevel):\n"
     "    t = threading.Thread(target=log.info, args=('target',),\n"
     "                         kwargs={'stacklevel': stacklevel}, "
     "name='first')\n"
     "    t.start(); t.join()\n"
     "got, _ = c_path(lambda: thread_first(1))\n"
     "assert got[0][0][2]['funcName'] == 'run', got\n"
     "got, _ = c_path(lambda: thread_first(50))\n"
     "assert got[0][0][2]['funcName'] == '_bootstrap', got\n");
  // logging.captureWarnings: warnings.warn's record on py.warnings.
  Py("import warnings\n"
     "warned = logging.getLogger('py.warnings')\n"
     "warned.propagate = False\n"
     "warned_keep = keep(warned)\n"
     "logging.captureWarnings(True)\n"
     "try:\n"
     "    with warnings.catch_warnings():\n"
     "        warnings.simplefilter('always')\n"
     "        logging.captureWarnings(True)\n"
     "        got, _ = c_path(lambda: warnings.warn('careful'))\n"
     "finally:\n"
     "    logging.captureWarnings(False)\n"
     "    KEEPS.remove(warned_keep)\n"
     "assert 'careful' in got[-1][0][2]['msg'], got\n");
}

TEST_CASE("The C methods pass records, arguments and handlers on as is",
          "[logger_log]") {
  Tree("t5");
  // LoggerAdapter.process's extras, messages that are not str, a lone
  // mapping as args, filters that change the record or answer truthy
  // non-bools, handlers added while the record is handed on, a handler
  // that logs (once) while it handles.
  Py("class Adapter(logging.LoggerAdapter):\n"
     "    def process(self, msg, kwargs):\n"
     "        kwargs['extra'] = {'user': 'u'}\n"
     "        return '[a] ' + msg, kwargs\n"
     "got, _ = c_path(lambda: Adapter(log, {}).warning('m %s', 1))\n"
     "assert got[0][0][2]['user'] == 'u', got\n"
     "_, raised = both(lambda: Adapter(log, {}).info('m', extra={}))[:2]\n"
     "c_path(lambda: log.info(42) or log.info(None) or log.info(['l'], 1))\n"
     "got, _ = c_path(lambda: log.info('%(a)s', {'a': 1}))\n"
     "assert got[0][0][2]['args'] == {'a': 1}, got\n"
     "c_path(lambda: log.info('%s', {}) or log.info('%s %s', {'a': 1}, 2))\n"
     "_, raised = both(lambda: log.info('m', extra={'msg': 'x'}))[:2]\n"
     "assert raised.startswith('KeyError'), raised\n"
     "def mutate(record):\n"
     "    record.msg = 'changed ' + str(record.msg)\n"
     "    record.added = 1\n"
     "    return 'truthy'\n"
     "log.addFilter(mutate)\n"
     "got, _ = c_path(lambda: log.info('m'))\n"
     "assert got[0][0][2]['msg'] == 'changed m', got\n"
     "log.removeFilter(mutate)\n"
     "log.addFilter(lambda r: 0.0)\n"
     "got, _ = both(lambda: log.info('zero'))[:2]\n"
     "assert got == [[], []], got\n"
     "log.filters.clear()\n"
     "class Adding:\n"
     "    level = 0\n"
     "    def handle(self, record):\n"
     "        log.handlers.remove(self)\n"
     "        log.handlers.append(late)\n"
     "class Late(Keep):\n"
     "    pass\n"
     "late = Late()\n"
     "KEEPS.append(late)\n"
     "def adding():\n"
     "    log.handlers[:] = [Adding(), child_keep]\n"
     "    log.info('adding')\n"
     "    log.handlers.remove(late)\n"
     "got, _ = c_path(adding)\n"
     "KEEPS.remove(late)\n"
     "assert [len(g) for g in got] == [0, 1, 1], got\n"  // child_keep skipped
     "log.handlers[:] = [child_keep]\n"
     "class Echo(logging.Handler):\n"
     "    def emit(self, record):\n"
     "        if not record.msg.startswith('echo'):\n"
     "            logging.getLogger('t5').warning('echo %s', record.msg)\n"
     "echo = Echo()\n"
     "log.addHandler(echo)\n"
     "got, _ = c_path(lambda: log.info('original'))\n"
     "log.removeHandler(echo)\n"
     "assert [[g[2]['msg'] for g in k] for k in got] == [\n"
     "    ['original'], ['echo %s', 'original']], got\n"
     // A handler that logs without end: RecursionError out of the logging
     // call on both paths (after how many records depends on the frames
     // each level takes, which the C methods do not have).
     "class Loop(logging.Handler):\n"
     "    def emit(self, record):\n"
     "        log.info('again')\n"
     "loop = Loop()\n"
     "log.addHandler(loop)\n"
     "for methods in (OURS, STDLIB):\n"
     "    use(methods)\n"
     "    try:\n"
     "        log.info('loop')\n"
     "        raise AssertionError('no RecursionError')\n"
     "    except RecursionError:\n"
     "        pass\n"
     "    finally:\n"
     "        use(OURS)\n"
     "log.removeHandler(loop)\n"
     "c_path(lambda: log.info('after the loop'))\n");
  // Logger classes: one overriding only makeRecord, one only handle (set
  // with setLoggerClass), one reading attributes through
  // __getattribute__, a logger made before the methods were C.
  Py("class OwnRecord(logging.Logger):\n"
     "    def makeRecord(self, *args, **kwargs):\n"
     "        record = super().makeRecord(*args, **kwargs)\n"
     "        record.own = 'record'\n"
     "        return record\n"
     "class OwnHandle(logging.Logger):\n"
     "    def handle(self, record):\n"
     "        record.own = 'handle'\n"
     "        super().handle(record)\n"
     "class Redirect(logging.Logger):\n"
     "    def __getattribute__(self, name):\n"
     "        if name == 'findCaller':\n"
     "            return lambda *a: ('redirected.py', 7, 'redirected', None)\n"
     "        return super().__getattribute__(name)\n"
     "made = []\n"
     "for cls in (OwnRecord, OwnHandle, Redirect):\n"
     "    logging.setLoggerClass(cls)\n"
     "    try:\n"
     "        made.append(logging.getLogger('t5.child.' + cls.__name__))\n"
     "    finally:\n"
     "        logging.setLoggerClass(logging.Logger)\n"
     "for logger in made:\n"
     "    got, _ = declined(lambda: logger.info('own'))\n"
     "assert got[0][0][2]['filename'] == 'redirected.py', got\n"
     // Subclasses whose info / _log call the stdlib's through super(): their
     // own frame is the caller, as in the stdlib.
     "class Prefixing(logging.Logger):\n"
     "    def info(self, msg, *args, **kwargs):\n"
     "        super().info('[p] ' + msg, *args, **kwargs)\n"
     "class Tagging(logging.Logger):\n"
     "    def _log(self, level, msg, args, **kwargs):\n"
     "        kwargs['extra'] = {'tag': 't'}\n"
     "        super()._log(level, msg, args, **kwargs)\n"
     "prefixing = Prefixing('t5.child.prefixing')\n"
     "tagging = Tagging('t5.child.tagging')\n"
     "prefixing.parent = tagging.parent = log\n"
     "got, _ = c_path(lambda: prefixing.info('m'))\n"
     "assert got[0][0][2]['funcName'] == 'info', got\n"
     "got, _, python = both(lambda: tagging.warning('m'))\n"
     "assert got[0][0][2]['funcName'] == '_log' and python == [['warning']] "
     "* 2, (got, python)\n");
}

TEST_CASE("The C methods print what the stdlib's print", "[logger_log]") {
  Tree("t6");
  // handleError's report (its "Call stack:" starts at the first frame
  // outside logging's directory, the same on both paths), lastResort's
  // line and the one-off "No handlers could be found" line, on stderr.
  Py("import contextlib, io\n"
     "def printed(call, before=lambda: None):\n"
     "    outs = []\n"
     "    for methods in (OURS, STDLIB):\n"
     "        before()\n"
     "        use(methods)\n"
     "        err = io.StringIO()\n"
     "        try:\n"
     "            with contextlib.redirect_stderr(err):\n"
     "                call()\n"
     "        finally:\n"
     "            use(OURS)\n"
     "        outs.append(err.getvalue())\n"
     "    assert outs[0] == outs[1], outs\n"
     "    return outs[0]\n"
     "bad = logging.StreamHandler(io.StringIO())\n"
     "log.addHandler(bad)\n"
     "out = printed(lambda: log.info('%d', 'not a number'))\n"
     "log.removeHandler(bad)\n"
     "assert out.startswith('--- Logging error ---') and 'Call stack:' in out\n"
     "assert \"Message: '%d'\" in out and 'in printed' in out, out\n"
     "alone = logging.getLogger('t6alone')\n"
     "alone.propagate = False\n"
     "out = printed(lambda: alone.warning('to lastResort %s', 1))\n"
     "assert out == 'to lastResort 1\\n', out\n"
     "saved = logging.lastResort\n"
     "logging.lastResort = None\n"
     "def fresh():\n"
     "    alone.manager.emittedNoHandlerWarning = False\n"
     "try:\n"
     "    out = printed(lambda: alone.warning('a') or alone.error('b'), "
     "fresh)\n"
     "finally:\n"
     "    logging.lastResort = saved\n"
     "assert out == 'No handlers could be found for logger \"t6alone\"\\n', "
     "out\n");
}

}  // namespace
}  // namespace agentix::worker
