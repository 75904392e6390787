"""What every bert_tf Beam pipeline shares: options, one-line errors, files written under temporary names."""

from __future__ import annotations

import logging
import os
import re
import uuid
from typing import Iterable, List, Optional, Sequence, Tuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

logger = logging.getLogger("bert_tf.beam")

# DirectRunner (Beam's default) first tries to start the Prism runner, which it downloads from the
# network. The engine it falls back to, the FnApiRunner, runs the same pipeline in local worker
# processes with no download: a local run uses it directly.
DIRECT_RUNNERS = ("directrunner", "direct", "switchingdirectrunner")
LOCAL_RUNNER = "FnApiRunner"


class BeamJobError(ValueError):
    """A bad input found inside a pipeline; the message is one line that names the file."""


def pipeline_options(beam_args: Sequence[str], runner: Optional[str], num_workers: int = 0) -> PipelineOptions:
    """PipelineOptions from the Beam flags a script passed through, with bert_tf's local defaults.

    --runner=DirectRunner (or none) runs on the FnApiRunner in `num_workers` processes
    (--direct_running_mode=multi_processing, --direct_num_workers=N unless given), which never
    tries to download a runner; every other runner (DataflowRunner, FlinkRunner, ...) is used as given.
    """
    args = [a for a in beam_args if not a.startswith("--runner")]
    options = PipelineOptions(args)
    name = runner or "DirectRunner"
    if name.lower() in DIRECT_RUNNERS:
        name = LOCAL_RUNNER
        direct = options.view_as(DirectOptions)
        if not any(a.startswith("--direct_running_mode") for a in args):
            direct.direct_running_mode = "multi_processing"
        if not any(a.startswith("--direct_num_workers") for a in args):
            direct.direct_num_workers = num_workers or os.cpu_count() or 1
    options.view_as(StandardOptions).runner = name
    return options


def is_local(options: PipelineOptions) -> bool:
    return (options.view_as(StandardOptions).runner or "").lower() in DIRECT_RUNNERS + ("fnapirunner",)


def quiet_local_logs() -> None:
    """Local runs: the job service re-logs every worker traceback; the script prints one line instead."""
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    logging.getLogger("apache_beam.runners.portability.local_job_service").setLevel(logging.CRITICAL)
    logging.getLogger("apache_beam.runners.worker").setLevel(logging.CRITICAL)


_ERROR_LINE = re.compile(r"(?:BeamJobError|InputError|PretrainingDataError|VocabError): (.+?)"
                         r"(?: \[while running '[^']*'\])*$", re.M)


def job_error(exc: BaseException) -> Optional[str]:
    """The one-line message of a bert_tf error raised inside a pipeline (runners wrap it), or None."""
    if isinstance(exc, BeamJobError):
        return str(exc)
    match = _ERROR_LINE.search(str(exc))
    return match.group(1).strip() if match else None


def run(pipeline: beam.Pipeline):
    """Runs a built pipeline to the end (returns its result); a bert_tf error inside it raises BeamJobError."""
    try:
        result = pipeline.run()
        result.wait_until_finish()
        return result
    except Exception as e:  # runners wrap worker errors in their own types
        message = job_error(e)
        if message is None:
            raise
        raise BeamJobError(message) from None


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
