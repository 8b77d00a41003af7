"""The hash-chained, crash- and concurrency-safe writer of ``agent.log``.

One record = one ``write`` of one whole line on an ``O_APPEND`` descriptor, under a
``threading.Lock`` *and* an exclusive ``flock`` on ``agent.log.lock``, so any number of threads
and processes sharing the home produce one valid chain. A torn last line (a crash, a short write)
is kept on a line of its own and named by a chained ``chain_resumed`` event; ``verify`` accepts an
unparseable line only when such an event follows it.

With a signing key (:mod:`audit.signing`), signed checkpoints (:mod:`audit.checkpoints`) are
appended under the same locks: every ``checkpoint_every`` records, ``checkpoint_seconds`` after an
uncovered record, at close and exit, and at every rotation (naming what retention deletes).

Failures never break a call unless ``settings.required``: the record is counted as lost, the
problem reported once on stderr, and the next line written carries ``audit_write_error``.
How concurrent writers agree: docs/design.md, "The audit log".
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import hashlib
import os
import stat
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from audit.chain import GENESIS_HASH, MAX_LINE_BYTES, LineFields, fast_fields, loads_line, parse_fields
from audit.checkpoints import MAX_BLOCK, checkpoints_path
from audit.checkpoints import render as render_checkpoint
from audit.errors import AuditWriteError
from audit.logfiles import backup_path, iter_lines_reverse, list_log_files, lock_path
from audit.processors import RecordRenderer, format_ts
from audit.records import (
    AUDIT_WRITE_ERROR,
    EVENT,
    EVENT_CHAIN_RESUMED,
    EVENT_LLM_CALL,
    HASH,
    KIND,
    KIND_CALL,
    KIND_EVENT,
    PREV_HASH,
    SEQ,
)
from audit.settings import AuditSettings
from audit.signing import AuditKeyError, key_file, load_signer, pub_file, read_keyring

__all__ = ["AuditLog", "AuditWriteError", "get_audit_log", "close_all"]

_FILE_MODE = 0o640
_STR_ONLY = frozenset({str})
_MIN_FREE_BYTES = 64 * 1024
#: agent.log.lock's content: the spare-record bytes of the active file (its inode), shared by every writer
_SPARE_TAG = b"spare"
_SPARE_SIZE = 64

WriteFn = Callable[[int, bytes], int]


class _NoRoom(Exception):
    """A spare record finds its file's spare room used up (nothing was written)."""


class _Failure:
    """Records lost since the last successful write."""

    __slots__ = ("reason", "lost", "since")

    def __init__(self, reason: str, since: str) -> None:
        self.reason = reason
        self.lost = 0
        self.since = since

    def as_field(self) -> dict[str, Any]:
        return {"error": self.reason, "lost_records": self.lost, "since": self.since}


def _describe(exc: BaseException) -> str:
    """What failed, without anything that could carry record content or secrets."""
    if isinstance(exc, OSError):
        name = errno.errorcode.get(exc.errno or 0, "")
        text = exc.strerror or str(exc.args[0] if exc.args else "")
        return f"{type(exc).__name__}: {text}" + (f" ({name})" if name else "")
    return type(exc).__name__


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _retired(pub: Path, signer: Any) -> bool:
    """Whether the public keys file records ``signer``'s key as retired by a key rotation."""
    try:
        _keys, retirements = read_keyring(pub)
    except (AuditKeyError, OSError):
        return False
    return any((r.name, r.key_id) == (signer.name, signer.key_id) for r in retirements)


def _last_record(fd: int, size: int) -> tuple[LineFields, int] | None:
    """Chain fields of the last complete record in ``fd[:size]`` and the offset just after it.

    Lines are parsed with the readers' bounded parser: a hostile line (too long,
    nested 10^5 deep) is skipped like any unreadable one instead of failing every write.
    """
    for offset, line in iter_lines_reverse(fd, size, limit=MAX_LINE_BYTES):
        if line is None:
            continue
        fields = fast_fields(line)
        if fields is None:
            try:
                fields = parse_fields(loads_line(line))
            except ValueError:
                fields = None
        if fields is not None:
            end = offset + len(line)
            return fields, (end + 1 if end < size else end)
    return None


class AuditLog:
    """Writer of one audit log file (and its rotated backups).

    Thread-safe and safe across processes. Prefer :func:`get_audit_log`, which
    keeps one instance per file per process. ``redact`` is applied to every
    string value before hashing; ``clock`` returns epoch seconds (tests);
    ``write_fn`` replaces ``os.write`` (a seam to simulate a full disk).
    """

    def __init__(
        self,
        path: Path | str,
        settings: AuditSettings = AuditSettings(),
        *,
        redact: Callable[[str], str] | None = None,
        clock: Callable[[], float] | None = None,
        write_fn: WriteFn | None = None,
        signer: Any = "auto",
    ) -> None:
        self.path = Path(path).expanduser()
        self._path_str = os.fspath(self.path)  # stat'ed before every write: no Path.__fspath__ each time
        self._lock_path = lock_path(self.path)
        self._settings = settings
        self._redact = redact
        self._clock = clock or time.time
        self._write_fn: WriteFn = write_fn or os.write
        self._tlock = threading.Lock()
        self._pid = os.getpid()
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._ident: tuple[int, int] | None = None  # (st_dev, st_ino) of self._fd
        self._known: tuple[int, int] | None = None  # (st_ino, st_size) right after our last write
        self._seq = 0
        self._hash = GENESIS_HASH
        self._failure: _Failure | None = None
        self._no_rotate = False
        # checkpoints: "auto" = the key named by the settings, loaded on first use
        self._signer_auto = signer == "auto"
        self._signer: Any = None if self._signer_auto else signer
        self._signer_loaded = not self._signer_auto
        self._signer_stamp: tuple[Any, ...] | None = None
        self._cp_fd: int | None = None
        self._cp_known: tuple[int, int] | None = None
        self._cp_seq: int | None = None  # head seq of the last checkpoint this instance wrote
        self._dirty = False  # records written since then
        self._timer: threading.Timer | None = None
        self._cp_failed = False
        self._renderer = self._make_renderer()
        self._observer: Callable[[dict[str, Any]], None] | None = None
        _INSTANCES.add(self)

    # -- public API -------------------------------------------------------------

    @property
    def settings(self) -> AuditSettings:
        return self._settings

    @property
    def head(self) -> tuple[int, str]:
        """``(seq, hash)`` of the last record this instance wrote or resumed from."""
        return self._seq, self._hash

    def write(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Append one call record; returns it as written (with ``seq``, ``prev_hash``, ``hash``).

        ``kind`` defaults to ``"call"`` and ``event`` to ``"llm_call"``. If the
        log cannot be written: with ``settings.required`` raise
        :class:`AuditWriteError`; otherwise return the record without chain
        fields (it was lost and is counted).
        """
        event_dict = dict(record)
        if set(map(type, event_dict)) - _STR_ONLY:
            event_dict = {str(k): v for k, v in event_dict.items()}
        event_dict.setdefault(KIND, KIND_CALL)
        event_dict.setdefault(EVENT, EVENT_LLM_CALL)
        written = self._emit(event_dict, raise_required=True)
        observer = self._observer
        if observer is not None:
            try:
                observer(written)
            except Exception:  # noqa: BLE001 - an observer (telemetry) never breaks the record's call
                pass
        return written

    def write_event(self, event: str, /, **fields: Any) -> None:
        """Append an operational event (``kind: "event"``), chained like call records.

        Never raises, even with ``required``: events are not calls. A failure
        is counted and reported like any other lost record.
        """
        event_dict = dict(fields)
        event_dict[EVENT] = str(event)
        event_dict[KIND] = KIND_EVENT
        self._emit(event_dict, raise_required=False)

    def write_spare_event(self, event: str, /, *, force: bool = False, **fields: Any) -> bool:
        """:meth:`write_event` for a record that must never push older ones out (refusals of requests
        nobody authenticated): it is written in room that does not count toward ``max_bytes``, so it
        never rotates the log. Each file has ``max_bytes`` of such room; False (nothing written) when it
        is used up, unless ``force`` (a caller's one summary of what found no room). A write failure is
        counted and reported like any event's, and returns True."""
        event_dict = dict(fields)
        event_dict[EVENT] = str(event)
        event_dict[KIND] = KIND_EVENT
        return self._emit(event_dict, raise_required=False, spare="force" if force else "room") is not None

    def record_event(self, event: str, /, **fields: Any) -> dict[str, Any]:
        """:meth:`write_event` for an action that must not happen unrecorded (``limits reset``):
        returns the record as written, or raises :class:`AuditWriteError` whatever
        ``audit.required`` says (the failure is counted and reported all the same)."""
        event_dict = dict(fields)
        event_dict[EVENT] = str(event)
        event_dict[KIND] = KIND_EVENT
        return self._emit(event_dict, raise_required=True, always=True, report=False)

    def check_writable(self) -> None:
        """Raise :class:`AuditWriteError` unless a record could be appended now.

        Opens (creating if needed) the log and lock files, takes the lock,
        resynchronises the chain, and checks that some disk space is free.
        Called before a provider call when ``audit.required`` is true.
        """
        with self._tlock:
            try:
                self._prepare()
                try:
                    self._sync_tail()
                finally:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)  # type: ignore[arg-type]
                st = os.statvfs(self.path.parent)
                if st.f_bavail * st.f_frsize < _MIN_FREE_BYTES:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError as exc:
                self._close_fds()
                raise AuditWriteError(self.path, _describe(exc)) from None

    @property
    def signer(self) -> Any:
        """The signing key in use (None: no checkpoints); loads it on first use."""
        with self._tlock:
            self._ensure_signer()
            return self._signer

    def checkpoint(self, reason: str = "manual", *, signers: Any = None, extensions: tuple[str, ...] = (),
                   then: Callable[[int, str], None] | None = None) -> tuple[int, str]:
        """Append a signed checkpoint of the current head now; returns ``(seq, hash)``.

        ``signers`` (default: the writer's key) sign it together, e.g. the old
        and the new key of a key rotation; ``then(seq, hash)`` runs while the
        log is still locked (a key rotation installs the new key there, so no
        writer signs with the old one after the hand-over). Raises ``OSError``
        when the files cannot be written and ``AuditKeyError``-like ``ValueError``
        without a key.
        """
        with self._tlock:
            self._prepare()
            try:
                self._sync_tail()
                self._ensure_signer()
                chosen = list(signers) if signers else ([self._signer] if self._signer is not None else [])
                if not chosen:
                    raise ValueError("no audit signing key: run `plugin-llm audit keygen` first")
                self._write_checkpoint(reason, extensions, chosen)
                if then is not None:
                    then(self._seq, self._hash)
                return self._seq, self._hash
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)  # type: ignore[arg-type]

    def update_settings(self, settings: AuditSettings) -> None:
        """Apply new settings (config hot reload) from the next record on."""
        with self._tlock:
            key_changed = (settings.signing_key, settings.key_cmd) != (self._settings.signing_key, self._settings.key_cmd)
            self._settings = settings
            self._renderer = self._make_renderer()
            if key_changed and self._signer_auto:
                self._signer_loaded = False

    def set_observer(self, observer: Callable[[dict[str, Any]], None] | None) -> None:
        """Call ``observer(record)`` after each :meth:`write` with the record as written (as returned:
        with its chain fields, or without them if it was lost); None removes it. Its errors are ignored."""
        self._observer = observer

    def set_redactor(self, redact: Callable[[str], str] | None) -> None:
        """Replace the redactor (e.g. when credentials are reloaded)."""
        with self._tlock:
            self._redact = redact
            self._renderer = self._make_renderer()

    def close(self) -> None:
        """Checkpoint what this instance wrote since its last checkpoint (clean shutdown),
        then close the file descriptors; the next write reopens them."""
        with self._tlock:
            self._cancel_timer()
            if self._dirty and self._signer is not None:
                self._checkpoint_locked("shutdown")
            self._close_fds()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AuditLog({str(self.path)!r}, seq={self._seq})"

    # -- the pipeline -----------------------------------------------------------

    def _make_renderer(self) -> RecordRenderer:
        return RecordRenderer(clock=self._clock, redact=self._redact, log_content=self._settings.log_content)

    def _render_and_append(self, event_dict: dict[str, Any], spare: str = "") -> dict[str, Any]:
        """Locks held, ``seq``/``prev_hash`` set: render the line, append it, advance the head."""
        line, record = self._renderer.render(event_dict)
        self._append_locked(line, spare)
        self._seq, self._hash = record[SEQ], record[HASH]
        return record

    def _emit(self, event_dict: dict[str, Any], *, raise_required: bool, always: bool = False,
              report: bool = True, spare: str = "") -> dict[str, Any] | None:
        with self._tlock:
            try:
                self._prepare()
                try:
                    self._sync_tail()
                    if self._failure is not None:
                        event_dict[AUDIT_WRITE_ERROR] = self._failure.as_field()
                    event_dict[SEQ] = self._seq + 1
                    event_dict[PREV_HASH] = self._hash
                    try:
                        record = self._render_and_append(event_dict, spare)
                    except _NoRoom:
                        return None
                    if self._signer is not None:
                        self._after_record()
                    elif self._signer_auto and self._seq % self._settings.checkpoint_every == 0:
                        self._ensure_signer()  # a key created since (keygen while the host runs)
                finally:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - a logging failure must not break the call
                return self._failed(exc, event_dict, raise_required and (always or self._settings.required), report)
            self._failure = None
            return record

    def _prepare(self) -> None:
        """Open what is needed (after a fork: anew) and take the process lock."""
        if self._pid != os.getpid():
            self._after_fork()
        if not self._signer_loaded:
            self._ensure_signer()
        if self._lock_fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, _FILE_MODE)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)

    def _open_log(self) -> os.stat_result:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, _FILE_MODE)
        st = os.fstat(self._fd)
        self._ident = (st.st_dev, st.st_ino)
        self._known = None
        return st

    def _sync_tail(self) -> None:
        """Under the lock: make (seq, hash) match the end of the file on disk."""
        try:
            st: os.stat_result | None = os.stat(self._path_str)
        except FileNotFoundError:
            st = None
        if self._fd is None or st is None or (st.st_dev, st.st_ino) != self._ident:
            st = self._open_log()  # first use, or another process rotated/removed the file
        if self._known == (st.st_ino, st.st_size):
            return
        self._resume(st)

    def _resume(self, st: os.stat_result) -> None:
        """Find the last complete record (here or in the backups) and recover a torn tail."""
        assert self._fd is not None
        size = st.st_size
        found = _last_record(self._fd, size)
        good_end = found[1] if found else 0
        fields = found[0] if found else self._last_in_backups()
        self._seq, self._hash = (fields.seq, fields.hash) if fields else (0, GENESIS_HASH)
        torn_bytes = size - good_end
        torn_sha = ""
        if torn_bytes:
            torn_sha = self._digest_range(good_end, size)
        if size and os.pread(self._fd, 1, size - 1) != b"\n":
            self._write_all(b"\n")  # keep torn bytes on their own line; or finish a record missing only "\n"
            size += 1
        self._known = (st.st_ino, size)
        if torn_bytes:
            self._report(
                f"audit log {self.path}: {torn_bytes} byte(s) at offset {good_end} are not a complete "
                f"record (a crash or a full disk during a write); the chain resumes from seq {self._seq}"
            )
            self._no_rotate = True  # the event must sit right after the bytes it describes
            try:
                event_dict = {
                    EVENT: EVENT_CHAIN_RESUMED,
                    KIND: KIND_EVENT,
                    "file": self.path.name,
                    "torn_offset": good_end,
                    "torn_bytes": torn_bytes,
                    "torn_sha256": torn_sha,
                    "resumed_from_seq": self._seq,
                    SEQ: self._seq + 1,
                    PREV_HASH: self._hash,
                }
                self._render_and_append(event_dict)
            finally:
                self._no_rotate = False

    def _last_in_backups(self) -> LineFields | None:
        backups = [p for p in list_log_files(self.path) if p != self.path]
        for path in reversed(backups):  # newest backup first
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                found = _last_record(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
            if found:
                return found[0]
        return None

    def _digest_range(self, start: int, end: int) -> str:
        assert self._fd is not None
        digest = hashlib.sha256()
        pos = start
        while pos < end:
            chunk = os.pread(self._fd, min(1 << 20, end - pos), pos)
            if not chunk:
                break
            digest.update(chunk)
            pos += len(chunk)
        return digest.hexdigest()

    def _write_all(self, data: bytes) -> None:
        """Write ``data`` at the end of the file (one ``write`` unless the OS writes short)."""
        assert self._fd is not None
        while data:
            written = self._write_fn(self._fd, data)
            if written <= 0:
                raise OSError(errno.EIO, "short write to the audit log")
            data = data[written:]

    def _append_locked(self, line: bytes, spare: str = "") -> None:
        """Called by the chain's last stage, lock held: rotate if needed, append, fsync.

        A ``spare`` record never rotates and its bytes do not count toward ``max_bytes`` (their sum per
        file is kept in the lock file); "room" ones get at most ``max_bytes`` per file (else _NoRoom).
        """
        assert self._known is not None and self._fd is not None
        size = self._known[1]
        max_bytes = self._settings.max_bytes
        used = 0
        if spare and max_bytes:
            used = self._spare_bytes()
            if spare == "room" and used + len(line) > max_bytes:
                raise _NoRoom()
        elif max_bytes and size and size + len(line) > max_bytes and not self._no_rotate:
            if size - self._spare_bytes() + len(line) > max_bytes:  # spare records are not counted
                self._rotate()
                size = 0
        self._known = None
        self._write_all(line)
        if self._settings.fsync == "always":
            os.fsync(self._fd)
        self._known = (self._ident[1], size + len(line))  # type: ignore[index]
        if spare and max_bytes:
            try:
                self._set_spare_bytes(used + len(line))
            except OSError:  # the record is written; an undercount only makes the file rotate a little early
                pass

    def _spare_bytes(self) -> int:
        """Bytes of spare records in the active file, as the lock file says (0 for another file's); at most
        twice ``max_bytes``, so no count there can keep the file from ever rotating."""
        data = os.pread(self._lock_fd, _SPARE_SIZE, 0)  # type: ignore[arg-type]
        parts = data.split()
        if (len(parts) >= 3 and parts[0] == _SPARE_TAG and parts[1].isdigit() and parts[2].isdigit()
                and int(parts[1]) == self._ident[1]):  # type: ignore[index]
            return min(int(parts[2]), 2 * self._settings.max_bytes)
        return 0

    def _set_spare_bytes(self, count: int) -> None:
        data = b"%s %d %d\n" % (_SPARE_TAG, self._ident[1], count)  # type: ignore[index]
        os.pwrite(self._lock_fd, data.ljust(_SPARE_SIZE - 1) + b"\n", 0)  # type: ignore[arg-type]

    def _rotate(self) -> None:
        """agent.log -> agent.log.1 -> ... -> agent.log.N (dropped), then a fresh agent.log.

        Retention deletes only what ``backup_count`` gives up *and*, with a signing key, only once the
        rotation's signed checkpoint covers it: when that checkpoint cannot be written, nothing is
        deleted (the backups shift past N) until a later rotation's checkpoint covers them all.
        """
        keep = self._settings.backup_count
        prune = self._signer is None or self._checkpoint_rotation(keep)
        backups = sorted(int(p.name.rsplit(".", 1)[1]) for p in list_log_files(self.path)[:-1])
        if prune:
            for index in backups:
                if index >= keep:
                    backup_path(self.path, index).unlink(missing_ok=True)  # beyond retention
            backups = [index for index in backups if index < keep]
        if keep == 0 and prune:
            self.path.unlink(missing_ok=True)
        else:
            for index in reversed(backups):
                os.replace(backup_path(self.path, index), backup_path(self.path, index + 1))
            os.replace(self.path, backup_path(self.path, 1))
        st = self._open_log()
        if self._settings.fsync == "always":
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        self._known = (st.st_ino, st.st_size)

    # -- checkpoints ------------------------------------------------------------

    def _home(self) -> Path:
        return self.path.parent.parent  # <home>/logs/agent.log

    def _ensure_signer(self) -> None:
        """Load (or reload, when the key file changed) the signing key named by the settings."""
        if not self._signer_auto:
            return

        settings = self._settings
        path = key_file(self._home(), settings.signing_key or None)
        pub = pub_file(path)
        # what a key rotation changes: the key file, and the public keys file (its retired line);
        # with key_cmd only the latter
        stamp = (_stamp(pub),) if settings.key_cmd else (_stamp(path), _stamp(pub))
        if self._signer_loaded and stamp == self._signer_stamp:
            return
        self._signer_loaded = True
        self._signer_stamp = stamp
        try:
            self._signer = load_signer(path, settings.key_cmd)
        except (AuditKeyError, OSError) as exc:
            self._signer = None
            reason = str(exc) if isinstance(exc, AuditKeyError) else f"{path}: {_describe(exc)}"
            self._report(f"audit signing key not used, so no signed checkpoints are written: {reason}")
            return
        if self._signer is not None and _retired(pub, self._signer):
            where = "audit.key_cmd" if settings.key_cmd else str(path)
            self._report(f"audit signing key {self._signer.key_id_hex} ({where}) was retired by `audit keygen "
                         f"--rotate` ({pub}): it signs no more checkpoints; install the new key")
            self._signer, self._signer_stamp = None, None  # looked at again before the next checkpoint

    def _after_record(self) -> None:
        """Lock held, a record just written: checkpoint on a multiple of N, else arm the timer."""
        self._dirty = True
        if self._seq % self._settings.checkpoint_every == 0:
            self._ensure_signer()  # the key file may have been rotated
            if self._signer is not None:
                try:
                    self._write_checkpoint("records", (), [self._signer])
                except Exception as exc:  # noqa: BLE001 - a checkpoint failure must not break the call
                    self._checkpoint_failed(exc)
        elif self._timer is None:
            ref = weakref.ref(self)
            timer = threading.Timer(self._settings.checkpoint_seconds, _timer_fired, (ref,))
            timer.daemon = True
            self._timer = timer
            timer.start()

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def _on_timer(self) -> None:
        with self._tlock:
            self._timer = None
            if not self._dirty or self._signer is None or self._pid != os.getpid():
                return
            self._checkpoint_locked("interval")

    def _checkpoint_locked(self, reason: str) -> None:
        """Thread lock held, flock maybe not: take it, checkpoint the head, never raise."""
        try:
            self._prepare()
            try:
                self._sync_tail()
                self._ensure_signer()  # a key rotated since: never sign with the retired key
                if self._signer is not None:
                    self._write_checkpoint(reason, (), [self._signer])
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - a checkpoint failure must not break the call
            self._checkpoint_failed(exc)

    def _checkpoint_failed(self, exc: BaseException) -> None:
        self._cp_known = None
        if not self._cp_failed:
            self._cp_failed = True
            self._report(f"audit checkpoint could not be written to {checkpoints_path(self.path)} ({_describe(exc)}); "
                         f"records stay chained but are not covered by a signature until one can")

    def _checkpoint_rotation(self, keep: int) -> bool:
        """Before rotating: a checkpoint of the head, naming the newest record retention deletes;
        whether it was written (so the records retention deletes are covered by a signature)."""
        files = list_log_files(self.path)
        doomed = [p for p in files[:-1] if int(p.name.rsplit(".", 1)[1]) >= keep]
        if keep == 0 and files and files[-1] == self.path:
            doomed.append(self.path)
        extensions: tuple[str, ...] = ()
        if doomed:
            newest = doomed[-1]  # files are oldest first; the active file last
            fields: LineFields | None = None
            try:
                fd = os.open(newest, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    found = _last_record(fd, os.fstat(fd).st_size)
                finally:
                    os.close(fd)
                fields = found[0] if found else None
            except OSError:
                fields = None
            if fields is not None:
                extensions = (f"pruned {fields.seq} {fields.hash}",)
        try:
            self._ensure_signer()
            if self._signer is not None:
                self._write_checkpoint("rotate", extensions, [self._signer])
        except Exception as exc:  # noqa: BLE001
            self._checkpoint_failed(exc)
            return False
        return True

    def _write_checkpoint(self, reason: str, extensions: tuple[str, ...] | list[str], signers: list[Any]) -> None:
        """Both locks held: append one checkpoint of (self._seq, self._hash), recovering a torn tail first."""
        fd = self._cp_fd
        if fd is None:
            fd = self._cp_fd = self._open_checkpoints()
        st = os.fstat(fd)
        try:
            on_disk = os.stat(checkpoints_path(self.path))
        except FileNotFoundError:
            on_disk = None
        if on_disk is None or (on_disk.st_dev, on_disk.st_ino) != (st.st_dev, st.st_ino):
            os.close(fd)
            self._cp_fd = None
            fd = self._cp_fd = self._open_checkpoints()
            st = os.fstat(fd)
        size = st.st_size
        lines = [f"time {format_ts(self._clock())}", f"reason {reason}"]
        if self._cp_known != (st.st_ino, size) and size:
            good_end = _checkpoints_good_end(fd, size)
            if good_end < size:
                torn = os.pread(fd, size - good_end, good_end) if size - good_end <= MAX_BLOCK * 4 else b""
                digest = hashlib.sha256(torn).hexdigest() if torn else self._digest_fd(fd, good_end, size)
                self._write_fd(fd, b"\n\n\n")
                size += 3
                lines.append(f"torn {good_end} {st.st_size - good_end} {digest}")
                self._report(f"audit checkpoints {checkpoints_path(self.path)}: {st.st_size - good_end} byte(s) at offset "
                             f"{good_end} are a torn checkpoint (a crash during a write); named in the next one")
        lines.extend(extensions)
        data = render_checkpoint(signers[0].name, self._seq, self._hash, lines, signers)
        self._cp_known = None
        self._write_fd(fd, data)
        if self._settings.fsync == "always":
            os.fsync(fd)
        self._cp_known = (st.st_ino, size + len(data))
        self._cp_seq = self._seq
        self._dirty = False
        self._cp_failed = False

    def _open_checkpoints(self) -> int:
        """The checkpoints file for appending; anything but a regular file there is refused (never blocks)."""
        path = checkpoints_path(self.path)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK, _FILE_MODE)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        self._cp_known = None
        return fd

    def _write_fd(self, fd: int, data: bytes) -> None:
        while data:
            written = self._write_fn(fd, data)
            if written <= 0:
                raise OSError(errno.EIO, "short write to the audit checkpoints")
            data = data[written:]

    def _digest_fd(self, fd: int, start: int, end: int) -> str:
        digest = hashlib.sha256()
        pos = start
        while pos < end:
            chunk = os.pread(fd, min(1 << 20, end - pos), pos)
            if not chunk:
                break
            digest.update(chunk)
            pos += len(chunk)
        return digest.hexdigest()

    # -- failures ---------------------------------------------------------------

    def _failed(self, exc: Exception, event_dict: dict[str, Any], raise_it: bool, report: bool = True) -> dict[str, Any]:
        """Count a lost record; raise it (``raise_it``) or return it without chain fields. ``report``: say
        so on stderr, once per failure (a caller that raises it to its user says it itself)."""
        reason = _describe(exc)
        self._known = None  # re-read the tail next time (a partial line may be there)
        if isinstance(exc, OSError) and exc.errno in (errno.EBADF, None):
            self._close_fds()
        if self._failure is None:
            self._failure = _Failure(reason, format_ts(self._clock()))
            if report:
                self._report(
                    f"audit log {self.path} cannot be written ({reason}); "
                    + (
                        "audit.required is true, so calls fail until it can."
                        if self._settings.required
                        else "calls continue; lost records are counted in the next line written "
                        "(set audit.required: true to fail calls instead)."
                    )
                )
        self._failure.lost += 1
        self._failure.reason = reason
        if raise_it:
            raise AuditWriteError(self.path, reason) from None
        for key in (SEQ, PREV_HASH, HASH, AUDIT_WRITE_ERROR):
            event_dict.pop(key, None)
        return event_dict

    def _report(self, message: str) -> None:
        try:
            print(f"plugin-llm: {message}", file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - stderr itself may be gone
            pass

    # -- descriptors and fork ---------------------------------------------------

    def _close_fds(self) -> None:
        self._cp_known = None
        for name in ("_fd", "_lock_fd", "_cp_fd"):
            fd = getattr(self, name)
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, name, None)
        self._ident = None
        self._known = None

    def _after_fork(self) -> None:
        """In a forked child: the inherited flock description is shared with the parent, so reopen."""
        self._pid = os.getpid()
        self._timer = None  # the parent's timer thread does not exist here
        self._dirty = False  # the parent checkpoints what it wrote
        self._close_fds()


_SIG_LINE_START = "\u2014 ".encode("utf-8")


def _checkpoints_good_end(fd: int, size: int) -> int:
    """Offset just after the last complete checkpoint block in ``fd[:size]`` (a signature line + blank line)."""
    window = min(size, MAX_BLOCK * 2)
    base = size - window
    data = os.pread(fd, window, base)
    i = len(data)
    while True:
        j = data.rfind(b"\n\n", 0, i)
        if j < 0:
            return base
        start = data.rfind(b"\n", 0, j) + 1
        if data[start:j].startswith(_SIG_LINE_START) and (start > 0 or base == 0):
            return base + j + 2
        i = j + 1  # "\n\n\n": the pair starting one byte earlier is looked at next


def _timer_fired(ref: "weakref.ref[AuditLog]") -> None:
    log = ref()
    if log is not None:
        try:
            log._on_timer()
        except Exception:  # pragma: no cover - never let a timer thread die noisily
            pass


_INSTANCES: weakref.WeakSet[AuditLog] = weakref.WeakSet()
_REGISTRY: dict[str, AuditLog] = {}
_REGISTRY_LOCK = threading.Lock()


def _reinit_after_fork() -> None:
    # A thread of the parent may have held these locks at fork time: the child needs fresh ones.
    global _REGISTRY_LOCK
    _REGISTRY_LOCK = threading.Lock()
    for log in list(_INSTANCES):
        log._tlock = threading.Lock()


os.register_at_fork(after_in_child=_reinit_after_fork)


def close_all() -> None:
    """Close every audit log this process opened (each waits for a write in progress
    and writes its shutdown checkpoint); also run at interpreter exit."""
    for log in list(_INSTANCES):
        try:
            log.close()
        except Exception:  # pragma: no cover - closing is best effort
            pass


atexit.register(close_all)


def get_audit_log(
    path: Path | str,
    settings: AuditSettings | None = None,
    redact: Callable[[str], str] | None = None,
) -> AuditLog:
    """The process-wide :class:`AuditLog` for ``path`` (one per resolved path; thread-safe).

    Given ``settings`` or ``redact`` that differ from the instance's, they are
    applied to it (so the call after a config reload picks them up).
    """
    key = os.path.realpath(os.path.expanduser(os.fspath(path)))
    with _REGISTRY_LOCK:
        log = _REGISTRY.get(key)
        if log is None:
            log = AuditLog(key, settings or AuditSettings(), redact=redact)
            _REGISTRY[key] = log
            return log
    if settings is not None and settings != log.settings:
        log.update_settings(settings)
    if redact is not None and redact is not log._redact:
        log.set_redactor(redact)
    return log
