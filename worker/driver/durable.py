"""The durable log file: records and captured lines, rotated by bytes."""

import errno
import logging
import os
import stat
import sys
import time

import _agentix_worker as _w

from .common import (
    _DEFAULT_FORMAT,
    _DEFAULT_LOG_DIR,
    _DURABLE_MAX_BYTES,
    _ORIGIN_STDERR,
    _ORIGIN_STDOUT,
    _WARNING,
    _log,
    _text,
)

def _expand_context(template, worker_id):
    """$AGENTIX_LOG_CONTEXT placeholders (SPEC 4); unknown ones stay."""
    host = os.uname().nodename  # socket.gethostname()'s answer on Linux
    for key, value in (("{uname}", host), ("{hostname}", host),
                       ("{pid}", str(os.getpid())), ("{id}", worker_id)):
        template = template.replace(key, value)
    return template


class _DurableFormatter(logging.Formatter):
    """A Formatter whose default asctime reuses the date and time of the
    previous record when the second is the same: localtime() and strftime()
    per record were a good part of the durable log's cost."""

    _second = (None, "")  # (int(created), its formatted date and time)

    def formatTime(self, record, datefmt=None):
        if datefmt:
            return super().formatTime(record, datefmt)
        second, text = self._second  # one tuple: consistent across threads
        created = int(record.created)
        if second != created:
            text = time.strftime(self.default_time_format,
                                 self.converter(created))
            self._second = (created, text)
        return self.default_msec_format % (text, record.msecs)

    def format(self, record):
        # The default format, for a record without exception or stack text:
        # the same line Formatter.format makes (and the same attributes set
        # on the record), without its generic steps (usesTime's search of the
        # format, formatMessage's %-formatting of the record's __dict__, the
        # exception and stack checks).
        if (self._fmt is _DEFAULT_FORMAT and record.exc_info is None
                and not record.exc_text and not record.stack_info):
            message = record.message = record.getMessage()
            asctime = record.asctime = self.formatTime(record)
            return "%s [%s] [%s] %s" % (asctime, record.agentix_context,
                                        record.name, message)
        return super().format(record)


class _DurableHandler(logging.FileHandler):
    """The durable log file (SPEC 3.4), rotated by bytes with one previous
    file kept (`path`.1). A write failure detaches it for good and says so
    once on the stderr stream.

    Each record is formatted once and the file's size is counted here: the
    stdlib's rollover check formats every record a second time and stats
    and seeks the file, which cost more than the write itself. The rotation
    is ours too (what RotatingFileHandler(backupCount=1) does): importing
    logging.handlers, with socket, queue and copy, was ~2.5 ms of every
    worker's boot (issue 25, cold start).

    A regular file is written through a shared mapping (_w.map_log): a line
    copied there is in the page cache, as a write() would have put it, so a
    SIGKILLed worker still leaves it, at a memcpy's cost instead of a system
    call's. The file grows a MiB at a time; close() and rotation cut it to
    the lines written, a crash leaves NUL bytes after them (trimmed when the
    file is opened again). Otherwise (a FIFO, a failed mapping, `mapped`
    False: $AGENTIX_LOG_MAPPED=0) one write() per line."""

    def __init__(self, path, channel, context, mapped=True):
        self.maxBytes = _DURABLE_MAX_BYTES
        self._map = mapped
        super().__init__(path, mode="a", encoding="utf-8")
        self._channel = channel
        self._context = context
        self.detached = False
        # True: _open admits regular files only (the stdlib's guard, kept).
        self._rotates = os.path.isfile(self.baseFilename)
        self._mapped = None
        self._size = self._current_size()
        self._fd = self.stream.fileno()
        self._line_formatter = None
        # handle() below in C (log_handles.h), as this instance's attribute:
        # logging calls it with no Python frame per record.
        self.handle = _w.durable_handle(self)

    def setFormatter(self, fmt):
        super().setFormatter(fmt)
        # The default format's line is written in C (handle) while this is
        # the formatter: the same line _DurableFormatter.format makes.
        self._line_formatter = fmt if (
            type(fmt) is _DurableFormatter and fmt._fmt is _DEFAULT_FORMAT
            and fmt.datefmt is None
            and fmt.converter is logging.Formatter.converter) else None

    def _open(self):
        """Opens (or creates, mode 0600) the log file itself, never what a
        symlink in its place points to, and only if it is a regular file of
        ours with no other name (a hard link planted to make us append to, or
        expose, another of our files). Also used to reopen after rotation."""
        # O_NONBLOCK: a FIFO planted there cannot hang the worker's boot.
        # O_RDWR: a shared mapping of the file needs it.
        flags = (os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                 | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            fd = os.open(self.baseFilename, flags, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _LogRefused("it is a symlink") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _LogRefused("it is not a regular file")
            if st.st_uid != os.geteuid():
                raise _LogRefused(f"it is owned by uid {st.st_uid}, not this "
                                  f"worker's uid {os.geteuid()}")
            if st.st_nlink != 1:
                raise _LogRefused(f"it has {st.st_nlink} hard links")
            if st.st_mode & 0o077:
                os.fchmod(fd, 0o600)  # ours: made private, not refused
            os.set_blocking(fd, True)
            return open(fd, "a", encoding=self.encoding, errors=self.errors)
        except BaseException:
            os.close(fd)
            raise

    def _current_size(self):
        """Maps the freshly opened file when it is a regular one; its size.
        A FIFO cannot tell(); it is not rotated, so its size does not
        matter."""
        if not (self._rotates and self.stream):
            return 0
        if not self._map:
            return self.stream.tell()
        try:
            self._mapped = _w.map_log(self.stream.fileno())
        except OSError:
            self._mapped = None  # write() per line, as before
            return self.stream.tell()
        return _w.mapped_log_length(self._mapped)

    def _unmap(self):
        """Unmaps the file, cut to the lines written."""
        mapped, self._mapped = self._mapped, None
        if mapped is not None:
            _w.close_log(mapped)

    def doRollover(self):
        """`path` becomes `path`.1 (replacing it) and a fresh `path` is
        opened (with _open's checks)."""
        try:
            self._unmap()
        finally:
            if self.stream:
                self.stream.close()
                self.stream = None
        backup = self.baseFilename + ".1"
        if os.path.exists(backup):
            os.remove(backup)
        if os.path.exists(self.baseFilename):
            os.rename(self.baseFilename, backup)
        self.stream = self._open()
        self._size = self._current_size()
        self._fd = self.stream.fileno() if self.stream else -1

    def close(self):
        with self.lock:
            try:
                self._unmap()
            finally:
                super().close()

    def handle(self, record):
        # Handler.handle, with the lock taken as a context manager and the
        # filter call only when there are filters: two Python calls less per
        # record.
        if self.filters and not self.filter(record):
            return False
        with self.lock:
            # A plain record in the default format: formatted and written
            # by C (write_log_line: the same line, one write per record, the
            # record's message and asctime set), else by emit(). -1: not
            # such a record, or the line would need a rollover first.
            if (self.formatter is self._line_formatter
                    and self._line_formatter is not None
                    and self.stream is not None):
                try:
                    size = _w.write_log_line(
                        record, self._mapped or self._fd, self._context,
                        max(self.maxBytes - self._size, 0) if self._rotates
                        else -1)
                except RecursionError:
                    raise
                except Exception:
                    self.handleError(record)  # a failed write detaches
                    return True
                if size >= 0:
                    self._size += size
                    return True
            self.emit(record)
        return True

    def emit(self, record):
        # handle() holds the lock: one thread at a time.
        try:
            if not hasattr(record, "agentix_context"):
                # Made without our record factory: still formats. (Here
                # rather than in a filter: a filter is one more call per
                # record.)
                record.agentix_context = self._context
            text = self.format(record) + self.terminator
            # Encoded here and written to the fd in one write(): the text
            # stream's write and flush cost more than the system call, and
            # nothing else writes through its buffer. A record that does
            # not encode is skipped (as the stream's strict encoder did).
            data = text.encode("utf-8")
            size = len(data)
            if self.stream is None:  # closed by a failed rollover
                self.stream = self._open()
                self._size = self._current_size()
                self._fd = self.stream.fileno()
            if self._rotates and self._size + size >= self.maxBytes:
                self.doRollover()
            if self._mapped is not None:
                _w.append_log(self._mapped, data)
            else:
                written = os.write(self._fd, data)
                if written != size:  # a regular file takes it all but full
                    view = memoryview(data)
                    while written < size:
                        written += os.write(self._fd, view[written:])
            self._size += size
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def handleError(self, record):
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            return  # a record that does not fit the format: skip it
        self.detach(f"after a write failure ({_text(exc)})")

    def detach(self, why):
        if self.detached:
            return
        self.detached = True
        try:
            self._channel.set_durable(False)
            logging.getLogger().removeHandler(self)
            self.close()
        except Exception:
            pass
        try:
            self._channel.send_stdio(
                _ORIGIN_STDERR, f"agentix: durable sandbox log detached {why}; "
                "later output is stream-only", "")
        except Exception:
            pass


class _LogRefused(OSError):
    """The durable log's directory or file is not safely ours."""


def _private_log_dir(log_dir):
    """Creates `log_dir` (mode 0700; missing parents as os.makedirs makes
    them), or checks the existing one: a directory, not a symlink, owned by
    this uid and writable by no one else. Anyone else who can write there
    could have planted the log file or a link in its place beforehand, so
    such a directory is refused, not repaired. Raises OSError."""
    try:
        os.makedirs(log_dir, mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(log_dir)
    if stat.S_ISLNK(st.st_mode):
        raise _LogRefused(f"its directory {log_dir} is a symlink")
    if not stat.S_ISDIR(st.st_mode):
        raise _LogRefused(f"{log_dir} is not a directory")
    if st.st_uid != os.geteuid():
        raise _LogRefused(f"its directory {log_dir} is owned by uid "
                          f"{st.st_uid}, not this worker's uid {os.geteuid()}")
    if st.st_mode & 0o022:
        raise _LogRefused(f"its directory {log_dir} is writable by group or "
                          f"others (mode {stat.S_IMODE(st.st_mode):o})")


def _open_durable(channel, worker_id, context):
    """The durable log handler, or None when disabled or impossible (then
    the reason goes to the daemon's log and the stderr stream, and calls
    run as usual)."""
    log_dir = os.environ.get("AGENTIX_LOG_DIR", _DEFAULT_LOG_DIR)
    if not log_dir:
        return None
    path = os.path.join(log_dir, f"sandbox-{worker_id}.log")
    try:
        _private_log_dir(log_dir)
        # "0": one write() per line, for a file followed with tail -f or
        # truncated from outside (a mapped file's readers see it grow a MiB
        # at a time; truncating it under the worker is a SIGBUS).
        handler = _DurableHandler(
            path, channel, context,
            mapped=os.environ.get("AGENTIX_LOG_MAPPED", "").strip() != "0")
    except Exception as exc:
        why = f"cannot open {path}: {_text(exc)}"
        if isinstance(exc, _LogRefused):
            why = (f"refusing {path}: {_text(exc)} (set AGENTIX_LOG_DIR to a "
                   "private directory, or to \"\" to turn the log off)")
        _log(_WARNING, f"durable sandbox log disabled: {why}")
        try:
            channel.send_stdio(
                _ORIGIN_STDERR, "agentix: durable sandbox log detached: "
                f"{why}; later output is stream-only", "")
        except Exception:
            pass
        return None
    handler.setFormatter(_DurableFormatter(
        os.environ.get("AGENTIX_LOG_FORMAT") or _DEFAULT_FORMAT))
    return handler


def _pump_durable(channel, handler, context):
    """Thread: appends captured stdout/stderr lines to the durable log."""
    _w.set_thread_name("agentix-durable")
    names = {_ORIGIN_STDOUT: "agentix.sandbox.stdout",
             _ORIGIN_STDERR: "agentix.sandbox.stderr"}
    while True:
        lines = channel.wait_stdio_lines()
        if lines is None or handler.detached:
            return
        for line in lines:  # StdioLine records
            try:
                time_ns = line.time_unix_nanos
                record = logging.LogRecord(names[line.origin], logging.INFO,
                                           "", 0, line.text, None, None)
                record.created = time_ns / 1e9
                record.msecs = (time_ns // 1000000) % 1000
                record.module = "stdio"
                record.agentix_context = context
                handler.handle(record)
            except Exception:
                pass
