"""Batch inference on Apache Beam: predict.py (any export, float or int8) and extract_features.py.

    input files (text / TSV / JSONL, globs) --Reshuffle--> per file: chunks of consecutive rows,
      keyed (file index, first row)
      --RunInference(our ModelHandler: the model loaded once per worker, a chunk per call,
        `batch_size` rows per model call as the single-process run batches them)-->
      JSON lines per chunk in a temporary file
      --chunks in key order cut into --num_output_shards contiguous runs--> JSONL shards,
        renamed into place when all are written

The rows are the single-process run's, in input order within and across the
shards (file by file). A chunk holds CHUNK_BATCHES batches, so the batches are
the single-process batches of each file and the numbers are the same.

Beam's TFModelHandlerTensor loads through tf.keras.models.load_model, which
cannot load our signature-only SavedModels under Keras 3; this handler uses
tf.saved_model.load and calls the serving signature (bert_tf/serving/predictor.py).
"""

from __future__ import annotations

import logging
from typing import Callable, Iterator, List, NamedTuple, Optional, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.ml.inference.base import ModelHandler, PredictionResult, RunInference

from bert_tf.beam import common
from bert_tf.data import text_input
from bert_tf.errors import ExportError, InputDataError

logger = logging.getLogger("bert_tf.beam")

CHUNK_BATCHES = 32  # batches per chunk: the unit of work and of temporary files


class Chunk(NamedTuple):
    key: tuple  # (file index, index of its first row in the file)
    rows: list


def _read_chunks(item, read: Callable, chunk_rows: int) -> Iterator[Chunk]:
    file_index, path = item
    rows: list = []
    start = 0
    try:
        for row in read(path):
            rows.append(row)
            if len(rows) == chunk_rows:
                yield Chunk((file_index, start), rows)
                start, rows = start + chunk_rows, []
    except (ValueError, OSError) as e:  # ExportError, a malformed line, an unreadable file
        raise InputDataError(str(e) if str(e).startswith(path) else f"{path}: {e}") from None
    if rows:
        yield Chunk((file_index, start), rows)


class LinesModelHandler(ModelHandler):
    """A model that turns a list of rows into JSON lines (predictor.Predictor, FeatureExtractor); a chunk per call.

    `load` is a picklable callable run once per worker process (the model is shared by its threads).
    """

    def __init__(self, load: Callable, batch_size: int):
        super().__init__(min_batch_size=1, max_batch_size=1)
        self._load, self.batch_size = load, batch_size

    def load_model(self):
        return self._load()

    def run_inference(self, batch: Sequence[Chunk], model, inference_args=None) -> List[PredictionResult]:
        out = []
        for chunk in batch:
            lines = []
            for start in range(0, len(chunk.rows), self.batch_size):
                lines.extend(model.lines(chunk.rows[start:start + self.batch_size]))
            out.append(PredictionResult(chunk.key, lines))
        return out

    def get_metrics_namespace(self) -> str:
        return "bert_tf"


class _LoadPredictor:
    def __init__(self, export_dir: str):
        self.export_dir = export_dir

    def __call__(self):
        # lazy: runs on the worker; the launcher builds the pipeline without loading TensorFlow
        from bert_tf.serving.predictor import Predictor

        return Predictor(self.export_dir, batch_size=1 << 30)  # the handler cuts the batches


class _LoadExtractor:
    def __init__(self, settings):
        self.settings = settings

    def __call__(self):
        return self.settings.build()


def _write_chunk(result: PredictionResult, temp_dir: str):
    key, lines = result.example, result.inference
    path = FileSystems.join(temp_dir, f"chunk-{key[0]:06d}-{key[1]:012d}.jsonl")
    common.write_part(path, "".join(line + "\n" for line in lines).encode("utf-8"))
    beam.metrics.Metrics.counter("bert_tf", "rows").inc(len(lines))
    return key, path, len(lines)


def run_inference(load: Callable, read: Callable, input_pattern: str, output_file: str, batch_size: int,
                  num_output_shards: int, beam_args: Sequence[str] = (), runner: Optional[str] = None,
                  num_workers: int = 0):
    """Runs `load`ed model over the rows `read` gives for every input file; returns a summary."""
    if batch_size < 1 or num_output_shards < 1:
        raise InputDataError("batch_size and num_output_shards must be >= 1")
    input_files = text_input.expand_input_patterns(input_pattern)
    for path in input_files:
        text_input.check_readable(path)
    paths = common.sharded_paths(output_file, num_output_shards)
    options = common.pipeline_options(beam_args, runner, num_workers)
    if common.is_local(options):
        common.quiet_local_logs()
    temp_dir = common.temp_dir_for(output_file)
    pipeline = common.make_pipeline(options)
    assigned = (pipeline
                | "Files" >> beam.Create(list(enumerate(input_files)))
                | "SpreadFiles" >> beam.Reshuffle()
                | "Chunks" >> beam.FlatMap(_read_chunks, read, batch_size * CHUNK_BATCHES)
                | "SpreadChunks" >> beam.Reshuffle()
                | "RunInference" >> RunInference(LinesModelHandler(load, batch_size))
                | "WriteChunks" >> beam.Map(_write_chunk, temp_dir)
                | "AllChunks" >> beam.combiners.ToList()
                | "AssignShards" >> beam.FlatMap(common.assign_contiguous, num_output_shards))
    common.write_sharded(pipeline, assigned, paths, temp_dir, common.concat_parts)
    try:
        result = common.run(pipeline)
    finally:
        common.remove_dir(temp_dir)
    return {"output_files": paths, "rows": common.counter(result, "rows")}


def run_predict(export_dir: str, input_pattern: str, output_file: str, batch_size: int = 32,
                num_output_shards: int = 1, beam_args: Sequence[str] = (), runner: Optional[str] = None,
                num_workers: int = 0):
    """predict.py --format=json on Beam: JSONL shards of its rows."""
    from bert_tf.serving import predictor  # lazy: only this job's launcher needs the predictor's TensorFlow

    try:
        predictor.check_export(export_dir)
    except ExportError as e:
        raise InputDataError(str(e)) from None
    return run_inference(_LoadPredictor(export_dir), predictor.iter_rows, input_pattern, output_file, batch_size,
                         num_output_shards, beam_args, runner, num_workers)


def run_features(settings, input_pattern: str, output_file: str, batch_size: int = 32, num_output_shards: int = 1,
                 beam_args: Sequence[str] = (), runner: Optional[str] = None, num_workers: int = 0):
    """extract_features.py on Beam (settings: feature_extraction.ExtractorSettings): JSONL shards of its lines."""
    from bert_tf import feature_extraction  # lazy: only this job's launcher needs the extractor's TensorFlow

    return run_inference(_LoadExtractor(settings), feature_extraction.iter_examples, input_pattern, output_file,
                         batch_size, num_output_shards, beam_args, runner, num_workers)
