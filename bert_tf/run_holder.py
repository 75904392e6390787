"""One run per output_dir: a run holds its folder through a holder file, and a second run on it stops.

The holder file, <output_dir>/run_holder.json (HOLDER_FILE), names the run that holds the folder:
its host, process id (and that process's start, to tell a reused pid), when it started, a heartbeat
refreshed every HEARTBEAT_SECONDS by a daemon thread, and a token unique to the claim. A clean end
(success, a one-line error, SIGTERM's checkpoint-and-exit) removes it.

A second run that finds a live holder raises OutputDirHeld, one line naming the holder, before it has
written anything. A holder is taken over, with a log line, when it is gone: on this host its process
is dead (or its pid now belongs to another process), or on any host its heartbeat is older than
STALE_SECONDS (10 minutes; BERT_TF_HOLDER_STALE_SECONDS changes it). A kill -9 thus leaves a file
that the next run on the same host takes over at once, and a run on another host after STALE_SECONDS.

Claiming works without file locks, so on gs:// as on a local disk:
  1. read the holder file; a live holder of another run -> OutputDirHeld (nothing written);
  2. no holder: on a local disk the claim is linked into place (os.link fails when a file is there:
     one winner, at once); on a remote file system, and to take over a gone holder anywhere, the
     claim is written, then read back after SETTLE_SECONDS: every claimer read before the others
     wrote, so all writes land within that time, and the last writer is the one every claimer reads
     back; the others raise OutputDirHeld naming it.
The heartbeat reads the file before it rewrites it: a holder that finds another run's token there
(taken over while it was silent) logs an error and stops refreshing; its release leaves that file alone.

No TensorFlow here: local paths use plain Python, remote ones bert_tf.fileio (tf.io.gfile, imported lazily).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from typing import Dict, Iterator, Optional

from bert_tf import fileio
from bert_tf.errors import OutputDirHeld

logger = logging.getLogger("bert_tf.run_holder")

HOLDER_FILE = "run_holder.json"
HEARTBEAT_SECONDS = 30.0
# A heartbeat older than this means the holder is gone (20 missed heartbeats: a run stalled that long is not
# training); a relaunch on another host after a crash waits this long, or deletes the holder file.
STALE_SECONDS = 600.0
STALE_ENV = "BERT_TF_HOLDER_STALE_SECONDS"
# How long a claim waits before reading itself back: longer than the time from a claimer's read to its write
# (milliseconds locally; a remote write is one upload).
SETTLE_SECONDS = {"local": 0.2, "remote": 2.0}


def holder_path(output_dir: str) -> str:
    return os.path.join(output_dir, HOLDER_FILE)


def stale_seconds() -> float:
    try:
        return float(os.environ.get(STALE_ENV) or STALE_SECONDS)
    except ValueError:
        return STALE_SECONDS


def process_start(pid: int) -> Optional[str]:
    """When process `pid` started (clock ticks since boot, /proc/<pid>/stat field 22), None where /proc has
    no such process or there is no /proc; the state 'Z' (exited, not yet reaped) counts as no process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def this_process() -> Dict[str, object]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "process_start": process_start(os.getpid())}


def _alive(record: dict) -> bool:
    """Whether the holder's process (on this host) still runs: its pid exists and started when it did."""
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    start = process_start(pid)
    if os.path.exists("/proc") and start is None:
        return False  # a zombie, or gone between the two looks
    recorded = record.get("process_start")
    return recorded is None or start is None or start == recorded


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def describe(record: dict, now: Optional[float] = None) -> str:
    """pid 123 on host h since <start> (last heartbeat N s ago)."""
    if not record.get("token"):
        return "an unreadable holder file"
    now = time.time() if now is None else now
    beat = record.get("heartbeat")
    ago = f"{max(0, now - beat):.0f} s ago" if isinstance(beat, (int, float)) else "unknown"
    started = record.get("started")
    since = _when(started) if isinstance(started, (int, float)) else "an unknown time"
    return f"pid {record.get('pid')} on host {record.get('host')} since {since} (last heartbeat {ago})"


class _Local:
    """The holder file on a local disk: plain Python, atomic renames and links."""

    def __init__(self, path: str):
        self.path = path

    def read(self) -> Optional[str]:
        try:
            with open(self.path, encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _tmp(self, text: str) -> str:
        tmp = f"{self.path}.{uuid.uuid4().hex[:12]}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        return tmp

    def create(self, text: str) -> bool:
        """Puts `text` in place if no file is there (atomically); False when one is."""
        tmp = self._tmp(text)
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError as e:  # a file system without hard links: the read-back protocol decides
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            os.replace(tmp, self.path)
            tmp = None
            return False
        finally:
            if tmp:
                os.remove(tmp)

    def write(self, text: str) -> None:
        os.replace(self._tmp(text), self.path)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)


class _Remote:
    """The holder file on gs:// (or another tf.io.gfile file system): no links, so no atomic create."""

    def __init__(self, path: str):
        self.path = path

    def read(self) -> Optional[str]:
        import tensorflow as tf

        try:
            with fileio.open_file(self.path) as f:
                return f.read()
        except tf.errors.NotFoundError:
            return None

    def create(self, text: str) -> bool:
        self.write(text)
        return False  # no atomic create: the read-back decides

    def write(self, text: str) -> None:
        # Under a temporary name, then renamed: readers see the old file or the new one, never a part (a GCS
        # upload is atomic by itself, other file systems, such as ram://, show a file while it is written).
        import tensorflow as tf

        tmp = f"{self.path}.{uuid.uuid4().hex[:12]}.tmp"
        with fileio.open_file(tmp, "w") as f:
            f.write(text)
        tf.io.gfile.rename(tmp, self.path, overwrite=True)

    def remove(self) -> None:
        import tensorflow as tf

        with contextlib.suppress(tf.errors.NotFoundError):
            tf.io.gfile.remove(self.path)


class RunHolder:
    """This run's hold on output_dir: claim() takes it (or raises OutputDirHeld), release() gives it back.

    `me` (host, pid, process_start) and the timings are arguments for tests; runs use this process's."""

    def __init__(self, output_dir: str, *, me: Optional[dict] = None, stale_after: Optional[float] = None,
                 heartbeat_every: float = HEARTBEAT_SECONDS, settle: Optional[float] = None):
        self.output_dir = output_dir
        self.path = holder_path(output_dir)
        self.remote = fileio.is_remote(output_dir)
        self.file = _Remote(self.path) if self.remote else _Local(self.path)
        self.me = dict(me or this_process())
        self.stale_after = stale_seconds() if stale_after is None else stale_after
        self.heartbeat_every = heartbeat_every
        self.settle = SETTLE_SECONDS["remote" if self.remote else "local"] if settle is None else settle
        self.token = uuid.uuid4().hex
        self.record: Dict[str, object] = {}
        self.created_dirs: list = []  # local folders the claim made, removed again when left empty
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.lost = False  # another run took the folder over

    # ------------------------------------------------------------------ reading the holder
    def current(self) -> Optional[dict]:
        """The holder file's record; {} for a file that is not one (taken over as gone); None without a file."""
        text = self.file.read()
        if text is None:
            return None
        try:
            record = json.loads(text)
        except ValueError:
            return {}
        return record if isinstance(record, dict) else {}

    def why_gone(self, record: dict, now: Optional[float] = None) -> Optional[str]:
        """Why the holder of `record` no longer holds the folder, or None when it is live."""
        now = time.time() if now is None else now
        if not record.get("token"):
            return "the holder file is unreadable"
        if record.get("host") == self.me["host"]:
            if record.get("pid") == self.me["pid"] and record.get("process_start") == self.me["process_start"]:
                return "it is this process's own earlier claim"
            if not _alive(record):
                return "its process is gone"
        beat = record.get("heartbeat")
        if not isinstance(beat, (int, float)) or now - beat > self.stale_after:
            return f"no heartbeat for more than {self.stale_after:g} s"
        return None

    def held_message(self, record: dict) -> str:
        return (f"{self.output_dir}: another run holds this output_dir: {describe(record)}; wait for it to end or "
                f"use another output_dir (a holder gone from another host is taken over after {self.stale_after:g} "
                f"s without a heartbeat, or delete {self.path})")

    # ------------------------------------------------------------------ claim, heartbeat, release
    def _text(self) -> str:
        return json.dumps(self.record, indent=1) + "\n"

    def claim(self) -> "RunHolder":
        found = self.current()
        for _ in range(5):  # a claim still settling: the run that wins it is the one to name
            started = found.get("started") if found else None
            if not isinstance(started, (int, float)) or time.time() - started >= 2 * self.settle:
                break
            time.sleep(2 * self.settle)
            found = self.current()
        if found is not None:
            why = self.why_gone(found)
            if why is None:
                raise OutputDirHeld(self.held_message(found))
        now = time.time()
        self.record = dict(self.me, started=now, heartbeat=now, token=self.token,
                           command=" ".join(sys.argv)[:300])
        self._make_dirs()
        if found is None and self.file.create(self._text()):
            logger.info("holding %s (%s)", self.output_dir, self.path)
        else:
            if found is not None:
                self.file.write(self._text())
            time.sleep(self.settle)
            back = self.current()
            if back is None or back.get("token") != self.token:
                self._remove_created_dirs()
                if back is None:
                    raise OutputDirHeld(f"{self.output_dir}: {self.path} was removed while this run claimed it; "
                                        "is another run starting there?")
                raise OutputDirHeld(self.held_message(back))
            if found is not None:
                logger.warning("took over %s from %s: %s", self.output_dir, describe(found), why)
            else:
                logger.info("holding %s (%s)", self.output_dir, self.path)
        self._thread = threading.Thread(target=self._beat, name="run_holder heartbeat", daemon=True)
        self._thread.start()
        return self

    def heartbeat(self) -> bool:
        """Refreshes the heartbeat; False (and logs an error) when another run holds the file now."""
        if self.lost:
            return False
        found = self.current()
        if not found or found.get("token") != self.token:
            self.lost = True
            logger.error("%s: this run no longer holds output_dir: %s; another run took it over (this one was "
                         "silent for more than %g s?)", self.output_dir,
                         describe(found) if found else "the holder file is gone", self.stale_after)
            return False
        self.record["heartbeat"] = time.time()
        self.file.write(self._text())
        return True

    def _beat(self):
        while not self._stop.wait(self.heartbeat_every):
            try:
                if not self.heartbeat():
                    return
            except Exception as e:  # a file system hiccup: the next beat tries again
                logger.warning("%s: heartbeat not written (%s)", self.path, " ".join(str(e).split())[:200])

    def release(self) -> None:
        """Stops the heartbeat and removes the holder file (only this run's own), and the folders the claim made
        when they are left empty."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        found = self.current()
        if found and found.get("token") == self.token:
            self.file.remove()
        self._remove_created_dirs()

    def _make_dirs(self):
        if self.remote:  # an object needs no folder (tf.io.gfile.makedirs would write a placeholder)
            return
        missing, folder = [], os.path.abspath(self.output_dir)
        while not os.path.isdir(folder):
            missing.append(folder)
            folder = os.path.dirname(folder)
        fileio.make_parent_dirs(self.path)
        self.created_dirs = missing  # deepest first

    def _remove_created_dirs(self):
        for folder in self.created_dirs:
            try:
                os.rmdir(folder)
            except OSError:  # not empty: the run wrote there
                return
        self.created_dirs = []


# ------------------------------------------------------------------ what the runs call
_held: Dict[str, list] = {}  # canonical output_dir -> [RunHolder, depth] of this process
_held_lock = threading.Lock()


@contextlib.contextmanager
def holding(output_dir: str, chief: bool = True) -> Iterator[Optional[RunHolder]]:
    """Holds output_dir for the block (raises OutputDirHeld when another live run does). Nested holds of one
    folder in this process share the first (a two-stage run holds output_dir around its stages). `chief`
    False (a multi-worker job's other workers): the job's chief holds it; this process does nothing."""
    if not chief:
        yield None
        return
    key = fileio.canonical_path(output_dir)
    with _held_lock:
        entry = _held.get(key)
        if entry is not None:
            entry[1] += 1
    if entry is None:
        entry = [RunHolder(output_dir).claim(), 1]
        with _held_lock:
            _held[key] = entry
    try:
        yield entry[0]
    finally:
        with _held_lock:
            entry[1] -= 1
            last = entry[1] == 0
            if last:
                _held.pop(key, None)
        if last:
            entry[0].release()


def held_message(output_dir: str) -> Optional[str]:
    """The one line naming another live run that holds output_dir (what OutputDirHeld would say), else None;
    reads only (--overwrite_output_dir asks this before it clears anything)."""
    if fileio.canonical_path(output_dir) in _held:
        return None
    checker = RunHolder(output_dir)
    found = checker.current()
    if found is None or checker.why_gone(found) is not None:
        return None
    return checker.held_message(found)
