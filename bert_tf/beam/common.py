"""What every bert_tf Beam pipeline shares: options, one-line errors, files written under temporary names."""

from __future__ import annotations

import heapq
import importlib
import logging
import os
import re
import shlex
import sys
import tempfile
import threading
import time
import uuid
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions, WorkerOptions

from bert_tf.errors import CheckpointError, ConfigError, ExportError, InputDataError
from bert_tf.progress import PROGRESS_SECONDS, format_eta, format_rate

logger = logging.getLogger("bert_tf.beam")

# DirectRunner (Beam's default) first tries to start the Prism runner, which it downloads from the
# network. The engine it falls back to, the FnApiRunner, runs the same pipeline in local worker
# processes with no download: a local run uses it directly.
DIRECT_RUNNERS = ("directrunner", "direct", "switchingdirectrunner")
LOCAL_RUNNER = "FnApiRunner"


BeamJobError = InputDataError  # the old name, kept importable (bert_tf/errors.py: what can go wrong)


def pipeline_options(beam_args: Sequence[str], runner: Optional[str], num_workers: int = 0) -> PipelineOptions:
    """PipelineOptions from the Beam flags a script passed through, with bert_tf's local defaults.

    --runner=DirectRunner (or none) runs on the FnApiRunner in `num_workers` processes
    (--direct_running_mode=multi_processing, --direct_num_workers=N unless given), which never
    tries to download a runner; every other runner (DataflowRunner, FlinkRunner, ...) is used as given.
    """
    args = [a for a in beam_args if not a.startswith("--runner")]
    options = PipelineOptions(args)
    name = runner or "DirectRunner"
    check_runner(name)
    if num_workers < 0:
        raise InputDataError(f"--num_workers: must be >= 0 (0: all cores), got {num_workers}")
    if name.lower() in DIRECT_RUNNERS:
        name = LOCAL_RUNNER
        direct = options.view_as(DirectOptions)
        if not any(a.startswith("--direct_running_mode") for a in args):
            direct.direct_running_mode = "multi_processing"
        if not any(a.startswith("--direct_num_workers") for a in args):
            direct.direct_num_workers = num_workers or os.cpu_count() or 1
        if not any(a.startswith("--default_sdk_harness_log_level") for a in args):
            # The worker processes would log every failed bundle's traceback; the script prints one line.
            options.view_as(WorkerOptions).default_sdk_harness_log_level = "CRITICAL"
    options.view_as(StandardOptions).runner = name
    return options


def check_runner(name: str) -> None:
    """Raises InputDataError (one line) unless Beam can make a runner of this --runner value: one of its
    known names (any case, "Runner" optional, as Beam reads them) or a PipelineRunner class's dotted
    path that imports. Beam itself would fail later with a long traceback."""
    known = {n.lower() for n in StandardOptions.KNOWN_RUNNER_NAMES}
    if name.lower() in known or name.lower() + "runner" in known:
        return
    if "." not in name:
        raise InputDataError(f"--runner={name}: not a Beam runner (one of {', '.join(StandardOptions.KNOWN_RUNNER_NAMES)}, "
                           "or the dotted path of a PipelineRunner class)")
    module, _, attribute = name.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), attribute, None)
    except ImportError as e:
        raise InputDataError(f"--runner={name}: cannot import {module} ({e})") from None
    if found is None:
        raise InputDataError(f"--runner={name}: {module} has no {attribute}")


def is_local(options: PipelineOptions) -> bool:
    return (options.view_as(StandardOptions).runner or "").lower() in DIRECT_RUNNERS + ("fnapirunner",)


def make_pipeline(options: PipelineOptions) -> beam.Pipeline:
    """A Pipeline for these options; local worker processes write their stderr to a log file.

    (Beam's worker process prints the traceback of every failed bundle to stderr, whatever the log
    level; the scripts print one line instead, and the log keeps the rest.)
    """
    direct = options.view_as(DirectOptions)
    if not is_local(options) or direct.direct_running_mode != "multi_processing":
        try:
            return beam.Pipeline(options=options)
        except ValueError as e:  # Beam's validation of a remote runner's options: one problem per line
            problems = [line.strip().rstrip(".") for line in str(e).splitlines()[1:] if line.strip()]
            runner = options.view_as(StandardOptions).runner
            raise InputDataError(f"--runner={runner}: {'; '.join(problems) or str(e)} "
                               "(Beam pipeline options such as --project, --region, --temp_location)") from None
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.transforms.environments import SubprocessSDKEnvironment

    log = os.path.join(tempfile.gettempdir(), f"bert_tf_beam_workers_{os.getpid()}.log")
    logger.info("Beam worker processes' stderr: %s", log)
    command = f"{shlex.quote(sys.executable)} -m apache_beam.runners.worker.sdk_worker_main 2>>{shlex.quote(log)}"
    # The FnApiRunner builds this same environment for multi_processing; given here, the mode is left
    # as in_memory so that it keeps ours (its num_workers still starts that many processes).
    direct.direct_running_mode = "in_memory"
    logging.getLogger("apache_beam.runners.portability.fn_api_runner.fn_runner").setLevel(logging.ERROR)
    runner = FnApiRunner(default_environment=SubprocessSDKEnvironment.from_command_string(command))
    return beam.Pipeline(runner=runner, options=options)


def quiet_local_logs() -> None:
    """Local runs: the job service re-logs every worker traceback; the script prints one line instead."""
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    logging.getLogger("apache_beam.runners.portability.local_job_service").setLevel(logging.CRITICAL)
    logging.getLogger("apache_beam.runners.worker").setLevel(logging.CRITICAL)


# A bert_tf error raised in a worker reaches the launcher as text (its traceback), "<Class>: <message>".
_ERROR_LINE = re.compile(rf"(?:{'|'.join(c.__name__ for c in (InputDataError, ConfigError, CheckpointError, ExportError))}): "
                         r"(.+?)(?: \[while running '[^']*'\])*$", re.M)


def job_error(exc: BaseException) -> Optional[str]:
    """The one-line message of a bert_tf error raised inside a pipeline (runners wrap it), or None."""
    if isinstance(exc, InputDataError):
        return str(exc)
    match = _ERROR_LINE.search(str(exc))
    return match.group(1).strip() if match else None


def run(pipeline: beam.Pipeline):
    """Runs a built pipeline to the end (returns its result); a bert_tf error inside it raises InputDataError.
    A runner whose run() returns while the job runs (Dataflow, Flink, ...) gets a progress line every
    PROGRESS_SECONDS (wait_while_reporting); the local runner returns once the job is done."""
    try:
        result = pipeline.run()
        wait_while_reporting(result)
        return result
    except Exception as e:  # runners wrap worker errors in their own types
        message = job_error(e)
        if message is None:
            raise
        raise InputDataError(message) from None


def wait_while_reporting(result, every_seconds: float = PROGRESS_SECONDS, clock=time.monotonic) -> None:
    """Waits for a running job (result.wait_until_finish, in a thread: one call, as every runner allows),
    logging its bert_tf counters so far (documents, instances, rows: the workers' attempted counts) with
    their rate every `every_seconds`. An error of the wait is raised here."""
    failure: List[BaseException] = []

    def wait():
        try:
            result.wait_until_finish()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            failure.append(e)

    waiter = threading.Thread(target=wait, name="bert_tf_beam_wait", daemon=True)
    start = clock()
    waiter.start()
    waiter.join(every_seconds)
    while waiter.is_alive():
        counts = running_counters(result)
        elapsed = max(clock() - start, 1e-9)
        logger.info("job running for %s: %s", format_eta(elapsed), ", ".join(
            f"{name} {value:,} ({format_rate(value / elapsed)}/s)" for name, value in sorted(counts.items()))
            or "no counts yet")
        waiter.join(every_seconds)
    if failure:
        raise failure[0]


def running_counters(result) -> Dict[str, int]:
    """{name: attempted value} of the bert_tf counters of a running job ({} where the runner reports none)."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        found = result.metrics().query(MetricsFilter().with_namespace("bert_tf"))["counters"]
    except Exception:  # not every runner reports metrics while it runs
        return {}
    counts: Dict[str, int] = {}
    for c in found:
        counts[c.key.metric.name] = counts.get(c.key.metric.name, 0) + int(c.attempted or 0)
    return counts


def counter(result, name: str) -> Optional[int]:
    """The committed value of a bert_tf counter of a finished run (None where the runner does not report it)."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        found = result.metrics().query(MetricsFilter().with_namespace("bert_tf").with_name(name))["counters"]
    except Exception:  # not every runner reports metrics
        return None
    return sum(c.committed or 0 for c in found) if found else None


# ------------------------------------------------------------------ outputs through temporary names
def temp_dir_for(output_path: str) -> str:
    """A fresh directory beside the output for this job's temporary files."""
    parent, name = os.path.split(output_path.rstrip("/"))
    return FileSystems.join(parent or ".", f".{name}.beam-tmp-{uuid.uuid4().hex[:12]}")


def temp_name(final_path: str, temp_dir: str) -> str:
    return FileSystems.join(temp_dir, "final-" + os.path.basename(final_path))


def publish(pairs: Iterable[Tuple[str, str]]) -> List[str]:
    """Renames every (temporary, final) pair; the final names appear only once every file is complete."""
    pairs = sorted(pairs, key=lambda p: p[1])
    finals = [f for _, f in pairs]
    existing = [m.path for r in FileSystems.match(finals) for m in r.metadata_list]
    if existing:
        FileSystems.delete(existing)
    if pairs:
        FileSystems.rename([t for t, _ in pairs], finals)
    return finals


def remove_dir(path: str) -> None:
    """Deletes a temporary directory and everything in it (no error when it is not there)."""
    try:
        if FileSystems.exists(path):
            FileSystems.delete([path])
    except Exception as e:  # cleaning up must not hide the job's own error
        logger.warning("could not remove %s: %s", path, e)


# ------------------------------------------------------------------ sharded outputs from keyed parts
# A part is one unit of work's output in a temporary file: (key, temporary path, records). Parts go
# to shards by their keys and counts only, and a shard is written from its parts in key order, so
# every shard has the same bytes whatever the number of workers or the order they finished in.
Part = Tuple[tuple, str, int]


def assign_balanced(parts: Sequence[Part], num_shards: int) -> List[Tuple[int, Part]]:
    """Parts in key order, each to the shard with the fewest records so far (shards differ by one part at most)."""
    heap = [(0, s) for s in range(num_shards)]
    out = []
    for part in sorted(parts):
        count, shard = heapq.heappop(heap)
        out.append((shard, part))
        heapq.heappush(heap, (count + part[2], shard))
    return out


def assign_contiguous(parts: Sequence[Part], num_shards: int) -> List[Tuple[int, Part]]:
    """Parts in key order cut into num_shards runs of about equal records: shard i holds rows before shard i+1's."""
    parts = sorted(parts)
    total = sum(p[2] for p in parts) or 1
    out, before = [], 0
    for part in parts:
        out.append((min(num_shards - 1, before * num_shards // total), part))
        before += part[2]
    return out


def sharded_paths(output_file: str, num_shards: int) -> List[str]:
    return [f"{output_file}-{i:05d}-of-{num_shards:05d}" for i in range(num_shards)]


class _WriteShard(beam.DoFn):
    def __init__(self, final_paths: List[str], temp_dir: str, write: Callable):
        self.final_paths, self.temp_dir, self.write = final_paths, temp_dir, write

    def process(self, item):
        shard, parts = item
        parts = sorted(p for p in parts if p is not None)
        final = self.final_paths[shard]
        tmp = temp_name(final, self.temp_dir)
        with FileSystems.create(tmp) as out:
            written = self.write(shard, parts, out)
        yield tmp, final, written


def _publish(shards: List[Tuple[str, str, int]], temp_dir: str, check: Optional[Callable]) -> Iterator[int]:
    total = sum(n for _, _, n in shards)
    if check is not None:
        check(total)
    publish((tmp, final) for tmp, final, _ in shards)
    remove_dir(temp_dir)
    yield total


def write_sharded(pipeline: beam.Pipeline, assigned, final_paths: List[str], temp_dir: str, write: Callable,
                  check: Optional[Callable] = None):
    """(shard, part) pairs -> every final path written (empty shards too), then all renamed into place at once.

    write(shard, parts in key order, open output) writes a shard and returns its record count;
    check(total records) may raise before anything is renamed. Returns a PCollection of the total.
    """
    every_shard = pipeline | "EveryShard" >> beam.Create([(s, None) for s in range(len(final_paths))])
    return ((assigned, every_shard)
            | "WithEmptyShards" >> beam.Flatten()
            | "ByShard" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(_WriteShard(final_paths, temp_dir, write))
            | "AllShards" >> beam.combiners.ToList()
            | "Publish" >> beam.FlatMap(_publish, temp_dir, check))


def write_part(path: str, data: bytes) -> None:
    """A part's temporary file (a retried bundle rewrites the same bytes)."""
    with FileSystems.create(path) as f:
        f.write(data)


def concat_parts(shard: int, parts: Sequence[Part], out) -> int:
    """Writes the parts' files one after another (a shard of rows in key order)."""
    for _, path, _ in parts:
        with FileSystems.open(path) as f:
            while True:
                data = f.read(1 << 20)
                if not data:
                    break
                out.write(data)
    return sum(p[2] for p in parts)
