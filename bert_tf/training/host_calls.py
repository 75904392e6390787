"""How many steps the next host call runs: --iterations_per_loop when given, else chosen from the
measured step time so that the log line each call ends with comes often enough (docs/design.md,
"Progress without short loops").

Automatic (TrainSettings.iterations_per_loop None): a call lasts at most `target_seconds` (30 s in a
log, LIVE_SECONDS under a live bar on a terminal) and at most up to the next tenth of the run, so a
line comes at least every ~30 s and at each tenth. The first call of a process runs FIRST_CALL_STEPS
(its first step traces and compiles, the second gives the first measure); each call after it may grow
GROWTH times the last one's steps, so one slow or fast measure does not set a call's length. The
loop's own caps (the next checkpoint, evaluation, profile edge, end) still apply on top.

A host call costs the Python call of the compiled loop, fetching its outputs and writing a log line
and the TensorBoard scalars (milliseconds), and on an accelerator the steps it cannot overlap at
its edges: against calls of LIVE_SECONDS or longer that is a fraction of a percent. On a
multi-worker cluster every worker must run the same steps per call while each has its own clock,
so there the size is MULTI_WORKER_STEPS (still capped at the tenths), not a measured one.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from bert_tf.progress import PROGRESS_SECONDS, next_mark

LIVE_SECONDS = 2.0  # a call's length under a live bar: the bar moves about this often
FIRST_CALL_STEPS = 2
GROWTH = 8
MULTI_WORKER_STEPS = 100


@dataclasses.dataclass
class CallSizer:
    """fixed: --iterations_per_loop (None: automatic); total_steps: the run's last step (the tenths);
    target_seconds: the longest automatic call; same_on_all_workers: size without a clock."""

    fixed: Optional[int]
    total_steps: int
    target_seconds: float = PROGRESS_SECONDS
    same_on_all_workers: bool = False
    seconds_per_step: Optional[float] = None  # the last call's measure (None: none yet)
    last_steps: int = 0
    multiple: int = 1  # steps per compiled program (TrainSettings.steps_per_program): calls run whole programs

    def steps(self, step: int) -> int:
        """The next call's steps from global step `step` (before the loop's own caps): automatic sizes
        are rounded down to a multiple of `multiple`, at least one program (a tenth's mark may then pass)."""
        if self.fixed:
            return self.fixed
        if self.same_on_all_workers:
            n = MULTI_WORKER_STEPS
        elif self.seconds_per_step is None:
            n = FIRST_CALL_STEPS * self.multiple  # the first program compiles, the second measures
        else:
            n = min(int(self.target_seconds / max(self.seconds_per_step, 1e-9)), GROWTH * max(self.last_steps, 1))
        n = max(1, min(n, next_mark(step, self.total_steps) - step))
        return max(self.multiple, n // self.multiple * self.multiple)

    def observe(self, steps: int, timed_steps: int, seconds: float) -> None:
        """A call of `steps` steps ran; `seconds` is the time of its `timed_steps` (those after a compiling
        first step)."""
        self.last_steps = steps
        if timed_steps > 0 and seconds > 0:
            self.seconds_per_step = seconds / timed_steps
