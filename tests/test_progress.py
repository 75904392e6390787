"""Progress of long runs (bert_tf/progress.py) and the automatic host-call size (training/host_calls.py):
in-process, with a fake clock."""

import io
import logging
import math
import re

from bert_tf.errors import InputDataError
from bert_tf.progress import PROGRESS_SECONDS, Progress, format_eta, format_rate, next_mark, tenth_marks
from bert_tf.training.host_calls import FIRST_CALL_STEPS, GROWTH, MULTI_WORKER_STEPS, CallSizer


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_eta_and_rate_formats():
    assert format_eta(0) == "0h00m00s" and format_eta(59.9) == "0h00m59s"
    assert format_eta(3725) == "1h02m05s" and format_eta(90061) == "25h01m01s"
    assert format_eta(math.inf) == "?" and format_eta(-3) == "0h00m00s"
    assert [format_rate(r) for r in (1234.5, 42.25, 3.14159, 0.0123)] == ["1234", "42.2", "3.14", "0.0123"]


def test_tenth_marks_cover_each_tenth_of_the_run():
    assert tenth_marks(348) == [35, 70, 105, 140, 174, 209, 244, 279, 314, 348]
    assert tenth_marks(4) == [1, 2, 3, 4]  # fewer steps than tenths: each step
    assert next_mark(0, 348) == 35 and next_mark(35, 348) == 70 and next_mark(340, 348) == 348
    assert next_mark(348, 348) == 348


def test_a_line_is_due_every_30_seconds_at_each_tenth_and_at_the_end(caplog):
    clock = FakeClock()
    progress = Progress(1000, "documents", clock=clock, stream=io.StringIO())
    assert not progress.live
    with caplog.at_level(logging.INFO, logger="bert_tf.progress"):
        clock.now += 10
        assert not progress.update(50)  # 10 s, before the first tenth: nothing
        clock.now += 10
        assert progress.update(100)  # the first tenth
        clock.now += PROGRESS_SECONDS - 0.5
        assert not progress.update(150)
        clock.now += 0.5
        assert progress.update(160)  # 30 s after the last line, between tenths
        clock.now += 1
        assert progress.update(350)  # crossed 200 and 300: one line
        assert not progress.update(360)
        clock.now += 1
        assert progress.update(1000)  # the end
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4
    # 100 documents in 20 s: 5/s, 900 left: 3 min
    assert lines[0] == "100/1,000 documents (10%), 5.00 documents/s, ETA 0h03m00s", lines[0]
    assert lines[-1].startswith("1,000/1,000 documents (100%), ") and lines[-1].endswith("ETA 0h00m00s")


def test_without_a_total_lines_come_by_the_clock_with_count_and_rate(caplog):
    clock = FakeClock()
    progress = Progress(None, "texts", clock=clock, stream=io.StringIO())
    with caplog.at_level(logging.INFO, logger="bert_tf.progress"):
        for _ in range(100):  # 100 batches of 32, 1 s each
            clock.now += 1
            progress.count(32)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["960 texts, 32.0 texts/s", "1,920 texts, 32.0 texts/s", "2,880 texts, 32.0 texts/s"]


def test_every_call_logs_each_update_off_a_terminal_and_only_due_lines_on_one(caplog):
    clock = FakeClock()
    log_file, terminal = io.StringIO(), FakeTerminal()
    in_log = Progress(100, clock=clock, stream=log_file)
    live = Progress(100, clock=clock, stream=terminal)
    assert live.live and not in_log.live
    with caplog.at_level(logging.INFO, logger="bert_tf.progress"):
        for step in (2, 4, 6):
            clock.now += 1
            in_log.update(step, f"step {step}/100", every_call=True)
            live.update(step, f"step {step}/100", bar_text=f"bar {step}", every_call=True)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["step 2/100", "step 4/100", "step 6/100"]  # the log file's; the terminal logged none
    assert log_file.getvalue() == ""
    drawn = terminal.getvalue()
    assert drawn.count("\r") == 3 and drawn.endswith("\r  6% |#...................| bar 6\x1b[K"), repr(drawn)
    live.close()
    assert terminal.getvalue().endswith("\r\x1b[K")  # the bar is erased


def test_a_log_record_erases_the_bar_before_it_prints(caplog):
    caplog.set_level(logging.INFO)
    terminal = FakeTerminal()
    handler = logging.StreamHandler(terminal)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        progress = Progress(10, clock=FakeClock(), stream=terminal)
        progress.update(1, "one")  # the first tenth: a line, then the bar
        logging.getLogger("bert_tf.other").warning("checkpoint saved")
        progress.update(1, "one")
        progress.close()
        logging.getLogger("bert_tf.other").warning("after")
    finally:
        root.removeHandler(handler)
    text = terminal.getvalue()
    assert "one\n" in text  # the logged line
    # the record starts on a line of its own: the bar was erased right before it
    assert "| one\x1b[K\r\x1b[Kcheckpoint saved\n" in text, repr(text)
    assert text.endswith("\r\x1b[Kafter\n") and not handler.filters  # closed: the filter is gone


def test_automatic_calls_last_at_most_30_seconds_and_stop_at_each_tenth():
    """A simulated run of 20,000 steps of 0.05 s (a fake clock, the loop's own rule of taking the next call's
    size from the last one's time): every call but the first ramp lasts at most 30 s, none crosses a tenth
    mark, and calls grow from FIRST_CALL_STEPS by at most GROWTH times."""
    total, seconds_per_step = 20000, 0.05
    sizer = CallSizer(None, total)
    step, calls = 0, []
    while step < total:
        n = min(sizer.steps(step), total - step)
        calls.append((step, n))
        sizer.observe(n, n - 1 if step == 0 else n, (n - 1 if step == 0 else n) * seconds_per_step)
        step += n
    sizes = [n for _, n in calls]
    assert sizes[:4] == [FIRST_CALL_STEPS, GROWTH * FIRST_CALL_STEPS, GROWTH ** 2 * FIRST_CALL_STEPS, 600], sizes
    assert max(sizes) * seconds_per_step <= PROGRESS_SECONDS
    ends = {start + n for start, n in calls}
    assert set(tenth_marks(total)) <= ends  # a line at each tenth
    assert all(next_mark(start, total) >= start + n for start, n in calls)
    # long calls: about one per 30 s of the run, one more at each tenth, the ramp (43 calls: not every few steps)
    assert len(calls) <= total * seconds_per_step / PROGRESS_SECONDS + len(tenth_marks(total)) + 3


def test_a_short_run_gets_a_call_per_tenth_and_a_slow_step_one_step_calls():
    sizer = CallSizer(None, 348)
    sizer.observe(100, 100, 0.1)  # 1 ms steps: 30 s would be the whole run
    assert sizer.steps(0) == 35 and sizer.steps(35) == 35 and sizer.steps(340) == 8
    slow = CallSizer(None, 1000, target_seconds=2.0)
    slow.observe(2, 1, 45.0)  # 45 s a step (a big model on a CPU): one step a call
    assert slow.steps(2) == 1


def test_given_iterations_per_loop_and_multi_worker_sizes_do_not_read_a_clock():
    fixed = CallSizer(1000, 348)
    fixed.observe(5, 5, 500.0)
    assert fixed.steps(0) == 1000  # the loop's caps (end, checkpoint) apply on top, as before
    workers = CallSizer(None, 100000, same_on_all_workers=True)
    workers.observe(100, 100, 0.01)
    assert workers.steps(0) == MULTI_WORKER_STEPS and workers.steps(9950) == 50  # the first tenth



def test_a_running_beam_job_logs_its_counters_until_it_ends_and_its_error_is_raised(caplog):
    """bert_tf/beam/common.py: a job whose run() returns while it runs (Dataflow, Flink) is waited for in a
    thread while its counters are logged every `every_seconds`; the wait's error reaches the caller."""
    import threading
    import time
    from types import SimpleNamespace

    import pytest

    pytest.importorskip("apache_beam")  # the [beam] extra (not in the fast subset's install)
    from bert_tf.beam import common

    class Job:
        def __init__(self, error=None):
            self.finish, self.error, self.documents = threading.Event(), error, 0

        def wait_until_finish(self):
            self.finish.wait(5)
            if self.error:
                raise self.error

        def metrics(self):
            self.documents += 1200
            if self.documents >= 3600:
                self.finish.set()
            counters = [SimpleNamespace(key=SimpleNamespace(metric=SimpleNamespace(name="documents")),
                                        attempted=self.documents)]
            return SimpleNamespace(query=lambda _: {"counters": counters})

    with caplog.at_level(logging.INFO, logger="bert_tf.beam"):
        common.wait_while_reporting(Job(), every_seconds=0.05)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all(re.fullmatch(r"job running for 0h00m00s: documents [\d,]+ \(\S+/s\)", line)
                                   for line in lines), lines
    assert lines[-1].startswith("job running for 0h00m00s: documents 3,600 ")
    failing = Job(InputDataError("input_file: bad"))
    failing.finish.set()
    start = time.monotonic()
    with pytest.raises(InputDataError, match="input_file: bad"):
        common.wait_while_reporting(failing, every_seconds=10)
    assert time.monotonic() - start < 5  # a job that ends returns at once, not after every_seconds


def test_trainer_on_a_terminal_draws_the_bar_each_call_and_logs_each_tenth(tmp_path, caplog):
    """The Trainer with the default (automatic) calls and a terminal as its stream: a bar after every
    call, a log line at each tenth (and none for the first call, before the first tenth), short calls."""
    from test_training_loop import dataset_fn, make_trainer

    from bert_tf.training.host_calls import LIVE_SECONDS

    trainer = make_trainer(str(tmp_path), steps=40, iterations_per_loop=None, save_checkpoints_steps=40)
    trainer.progress_stream = terminal = FakeTerminal()
    with caplog.at_level(logging.INFO, logger="bert_tf.training"):
        trainer.train(dataset_fn)
    assert trainer._sizer.target_seconds == LIVE_SECONDS
    calls = [r["steps"] for r in trainer.loop_history]
    assert calls[0] == FIRST_CALL_STEPS and sum(calls) == 40, calls
    logged = [int(m.group(1)) for r in caplog.records if (m := re.match(r"step (\d+)/40 loss ", r.getMessage()))]
    assert logged == tenth_marks(40), logged
    drawn = terminal.getvalue()
    assert drawn.count("\r100% |" + "#" * 20 + "| step 40/40 loss ") == 1, repr(drawn[-300:])
    assert drawn.startswith("\r  5% |#...................| step 2/40 loss ")
    assert drawn.endswith("\r\x1b[K")  # the bar is gone once train() returns
