"""What a long run shows while it works: a line at least every PROGRESS_SECONDS and at each tenth of
the work, with how much is done, the rate and an ETA; on a terminal also a live one-line bar.

`Progress` prints; what is counted is the caller's (training steps, documents, texts):
  * off a terminal (a log file, a pipe) it writes log lines through `logging` (INFO);
  * on a terminal (stderr is a tty, TERM is not "dumb") it redraws one bar line in place on each
    update (`\\r`, then erase to the end of the line), and still logs a line when one is due, so the
    scrollback keeps the history. A log record of anyone else erases the bar first (a filter on the
    root logger's handlers that write to the same stream), so no line is printed after a half bar.
A line is due when PROGRESS_SECONDS have passed since the last one, when the count crosses a tenth of
the total (`tenth_marks`) or reaches the total.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
import time
from typing import Callable, List, Optional

logger = logging.getLogger("bert_tf.progress")

PROGRESS_SECONDS = 30.0  # the longest a long run goes without a line
TENTHS = 10  # and a line at each tenth of the work
BAR_WIDTH = 20  # characters of the bar's filled/empty part


def format_eta(seconds: float) -> str:
    """Seconds as `1h02m03s` ("?" when not finite: no rate yet)."""
    if not math.isfinite(seconds):
        return "?"
    seconds = max(int(seconds), 0)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


def format_rate(per_second: float) -> str:
    """A rate with three significant figures at most (no `0.0/s` for slow work, no decimals for fast)."""
    if per_second >= 100:
        return f"{per_second:.0f}"
    if per_second >= 10:
        return f"{per_second:.1f}"
    return f"{per_second:.2f}" if per_second >= 0.1 else f"{per_second:.3g}"


def tenth_marks(total: int) -> List[int]:
    """The counts at which each tenth of `total` is done: ceil(k * total / 10) for k = 1..10, without
    repeats (a total under 10 has fewer marks)."""
    return sorted({-(-k * total // TENTHS) for k in range(1, TENTHS + 1)})


def next_mark(done: int, total: int) -> int:
    """The first tenth mark past `done` (`total` once done is at or past the last one)."""
    for mark in tenth_marks(total):
        if mark > done:
            return mark
    return total


def on_terminal(stream) -> bool:
    """Whether a live bar can be drawn on `stream`: a tty, and a TERM that moves the cursor."""
    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """Shows the progress of `total` units of work (None: unknown, no percentage or ETA of its own).

    update(done, text) after each piece of work: off a terminal, a log line when due (or every call
    with every_call=True, the training loop's line per host call); on a terminal the bar, and the
    log line when due. count(n) is the short form for work measured by count alone (documents,
    texts): it builds the text from the rate. close() removes the bar.
    clock: seconds (time.monotonic; tests pass a fake one). tenths False: lines by the clock alone (work
    that is often short, where ten lines would be noise: a line only once it has run PROGRESS_SECONDS).
    """

    def __init__(self, total: Optional[int], unit: str = "", *, start: int = 0, live: Optional[bool] = None,
                 stream=None, clock: Callable[[], float] = time.monotonic, every_seconds: float = PROGRESS_SECONDS,
                 log: logging.Logger = logger, tenths: bool = True):
        self.total, self.unit = total, unit
        self.stream = stream if stream is not None else sys.stderr
        self.live = on_terminal(self.stream) if live is None else live
        self.clock, self.every_seconds, self.log, self.tenths = clock, every_seconds, log, tenths
        self.started = self.last_line = clock()
        self.start = self.done = self.logged = start
        self._bar_shown = False
        self._filter = None

    # ------------------------------------------------------------------ when
    def due(self, done: int) -> bool:
        """A line is due: PROGRESS_SECONDS since the last, a tenth mark crossed since the last, or the end."""
        if self.clock() - self.last_line >= self.every_seconds:
            return True
        if self.total and self.tenths:
            return done >= self.total or done >= next_mark(self.logged, self.total)
        return False

    def rate(self) -> float:
        """Units per second since the start (0 before any time has passed)."""
        elapsed = self.clock() - self.started
        return (self.done - self.start) / elapsed if elapsed > 0 else 0.0

    def eta_seconds(self) -> float:
        rate = self.rate()
        if not self.total or rate <= 0:
            return math.inf
        return max(self.total - self.done, 0) / rate

    # ------------------------------------------------------------------ what
    def describe(self) -> str:
        """`1,200/5,000 documents (24%), 40.0 documents/s, ETA 0h01m35s` (count and rate alone without a total)."""
        unit = f" {self.unit}" if self.unit else ""
        if self.total:
            head = f"{self.done:,}/{self.total:,}{unit} ({100 * self.done / self.total:.0f}%)"
            return f"{head}, {format_rate(self.rate())}{unit}/s, ETA {format_eta(self.eta_seconds())}"
        return f"{self.done:,}{unit}, {format_rate(self.rate())}{unit}/s"

    def bar(self, done: int, text: str) -> str:
        """The terminal line: ` 35% |#######.............| <text>` (no bar without a total), cut to the width."""
        if self.total:
            filled = min(BAR_WIDTH, BAR_WIDTH * done // self.total)
            head = f"{100 * done // self.total:3d}% |{'#' * filled}{'.' * (BAR_WIDTH - filled)}| "
        else:
            head = ""
        width = shutil.get_terminal_size((100, 24)).columns
        return (head + text)[:max(width - 1, 10)]

    # ------------------------------------------------------------------ showing
    def update(self, done: int, text: Optional[str] = None, *, bar_text: Optional[str] = None,
               every_call: bool = False, force: bool = False) -> bool:
        """`done` units are done; shows `text` (default: describe()) as said in the class docstring.
        bar_text: a shorter text for the bar (default: text). force: log a line now. Returns whether
        a line was logged."""
        self.done = done
        text = self.describe() if text is None else text
        log_it = force or self.due(done) or (every_call and not self.live)
        if log_it:
            self._erase()
            self.log.info("%s", text)
            self.last_line, self.logged = self.clock(), done
        if self.live:
            self._draw(self.bar(done, bar_text or text))
        return log_it

    def count(self, n: int = 1) -> bool:
        """Adds `n` units done; logs describe() when a line is due. Returns whether it did."""
        return self.update(self.done + n)

    def close(self) -> None:
        """Removes the bar (the last logged line stays)."""
        self._erase()
        if self._filter is not None:
            for handler in self._handlers():
                handler.removeFilter(self._filter)
            self._filter = None

    def _handlers(self):
        return [h for h in logging.getLogger().handlers if getattr(h, "stream", None) is self.stream]

    def _draw(self, line: str) -> None:
        if self._filter is None:  # other log records erase the bar before they print
            self._filter = _EraseBar(self)
            for handler in self._handlers():
                handler.addFilter(self._filter)
        try:
            self.stream.write("\r" + line + "\x1b[K")
            self.stream.flush()
        except (OSError, ValueError):  # a closed terminal: progress is never the end of a run
            self.live = False
            return
        self._bar_shown = True

    def _erase(self) -> None:
        if not self._bar_shown:
            return
        self._bar_shown = False
        try:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        except (OSError, ValueError):
            self.live = False


class _EraseBar(logging.Filter):
    """Erases a Progress bar before a handler prints a record on its line (passes every record)."""

    def __init__(self, progress: Progress):
        super().__init__()
        self.progress = progress

    def filter(self, record):
        self.progress._erase()
        return True
