"""re's cache answers the stdlib's import-time regexes from the build.

The modules a worker imports before its first call returns (traceback's
linecache and tokenize, textwrap, logging, pickle, then a tool module's
asyncio, platform, json, ...) compile ~20-50 regexes as they load; re
parses and compiles each in Python, ~0.1-1 ms apiece on a slow VM: a few
ms of every cold start (issue 25). The build compiled them already
(re_table_data.py, //worker:re_table_data, by the Python the worker links):
`install()` makes re's pattern cache a dict whose misses look there first
and make the Pattern with `_sre.compile` from the stored code, the object
re itself would have made (the build checks they compare equal). Anything
else, and any other Python (version, `_sre.MAGIC`, `_sre.CODESIZE`), goes
through re as before. User-visible: `type(re._cache)` (a private name) is
`_TableCache`, a dict subclass.
"""

import sys

from . import re_table_data as _data


class _TableCache(dict):
    """re._cache: a miss is looked up in the build's table; what it finds is
    stored as re stores what it compiles (the oldest entry dropped at
    re._MAXCACHE)."""

    __slots__ = ("_table",)

    def __missing__(self, key):
        entry = self._table.get(key)
        if entry is None:
            raise KeyError(key)
        import _sre
        import re
        pattern, _, flags, code, groups, groupindex, indexgroup = entry
        made = _sre.compile(pattern, flags, list(memoryview(code).cast("I")),
                            groups, dict(groupindex), indexgroup)
        if len(self) >= re._MAXCACHE:
            try:
                del self[next(iter(self))]
            except (StopIteration, RuntimeError, KeyError):
                pass
        self[key] = made
        return made


def install():
    """Makes re's cache a _TableCache. Returns the number of patterns it can
    answer (0: another Python than the build's, nothing changed)."""
    import _sre
    import re

    if (tuple(sys.version_info[:3]) != _data.PYTHON or
            _sre.MAGIC != _data.SRE_MAGIC or _sre.CODESIZE != _data.CODESIZE or
            type(re._cache) is not dict):
        return 0
    cache = _TableCache(re._cache)
    cache._table = {(type(e[0]), e[0], e[1]): e for e in _data.PATTERNS}
    re._cache = cache
    return len(cache._table)
