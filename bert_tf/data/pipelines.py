"""tf.data input pipelines for pretraining (the original's input_fn, made distributable).

Training: the files (comma-separated globs) are sharded per input pipeline
(one per worker, from the `tf.distribute.InputContext`), shuffled, read
`cycle_length` at a time with a parallel interleave, records shuffled,
batched per replica, parsed a batch at a time (vectorised), prefetched.
Evaluation reads the files in order, once.

When there are fewer files than input pipelines the records are sharded
instead of the files, so every worker still sees distinct data.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import struct
import zlib
from typing import List, Optional, Sequence, Union

import tensorflow as tf

from bert_tf import fileio
from bert_tf.data import masking, schema
from bert_tf.errors import InputDataError

# Records held for shuffling after the interleave (the original used 100 on top of
# shuffling the files; a larger buffer mixes better when there are few files).
SHUFFLE_BUFFER_SIZE = 1000
# Files read concurrently per input pipeline (the original's cycle_length cap).
CYCLE_LENGTH = 4


def expand_input_files(patterns: Union[str, Sequence[str]]) -> List[str]:
    """Comma-separated globs (or a list of them) -> sorted file list; one-line error when nothing matches."""
    if isinstance(patterns, str):
        patterns = [p for p in patterns.split(",") if p.strip()]
    files: List[str] = []
    for pattern in patterns:
        pattern = pattern.strip()
        matched = tf.io.gfile.glob(pattern) if "://" in pattern else sorted(glob.glob(pattern))
        if not matched:
            raise InputDataError(f"{pattern}: no input files match")
        files.extend(sorted(matched))
    if not files:
        raise InputDataError("no input files given")
    return files


def check_record_lengths(path: str, max_seq_length: int, max_predictions_per_seq: int) -> str:
    """Compares the flags with the lengths stored in the first record of `path`; one-line error on a mismatch.
    Returns the records' kind, schema.STATIC or schema.DYNAMIC (no masks, so no stored predictions length)."""
    try:
        found = schema.inspect_record_file(path)
    except tf.errors.DataLossError:
        scan = scan_record_file(path)
        if scan.corrupt_at is None:
            raise
        raise InputDataError(f"{describe_corrupt(scan)}; pass --skip_corrupt_records to read past it") from None
    except (ValueError, tf.errors.OpError) as e:
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputDataError(message if message.startswith(path) else f"{path}: {message}") from None
    wrong = [
        f"{name}={found[name]} (flag says {want})"
        for name, want in (("max_seq_length", max_seq_length), ("max_predictions_per_seq", max_predictions_per_seq))
        if found[name] not in (want, None)
    ]
    if wrong:
        raise InputDataError(
            f"{path}: records were written with {', '.join(wrong)}; pass the values the data was created with"
        )
    return found["masking"]


@dataclasses.dataclass(frozen=True)
class RecordFileScan:
    """What a CRC check of one TFRecord file found.

    records: records readable before the first corrupt one (all of them when intact).
    corrupt_at: byte offset (in the uncompressed stream) of the first corrupt record, or None.
    problem: what is wrong there ("bad data CRC", "truncated record", ...), or None.
    skipped: records after it whose framing is still intact (tf.data stops reading a file at its
      first corrupt record, so --skip_corrupt_records loses these too); -1 when unknown (framing lost).
    """

    path: str
    records: int
    corrupt_at: Optional[int] = None
    problem: Optional[str] = None
    skipped: int = 0


_HEADER = 12  # uint64 length + masked CRC of it
_FOOTER = 4  # masked CRC of the data


def scan_record_file(path: str) -> RecordFileScan:
    """Reads a TFRecord file (plain or GZIP) and checks every record's framing and CRCs."""
    with fileio.open_file(path, "rb") as f:
        magic = f.read(2)
    raw = fileio.open_file(path, "rb")
    records, offset, bad = 0, 0, None
    with raw, (gzip.GzipFile(fileobj=raw, mode="rb") if magic == schema.GZIP_MAGIC else raw) as f:
        try:
            while True:
                header = f.read(_HEADER)
                if not header:
                    break
                if len(header) < _HEADER:
                    bad = "truncated record header"
                    break
                length, header_crc = struct.unpack("<QI", header)
                if struct.pack("<I", header_crc) != schema._masked_crc(header[:8]):
                    bad = "bad length CRC"
                    break
                body = f.read(length + _FOOTER)
                if len(body) < length + _FOOTER:
                    bad = "truncated record"
                    break
                if body[length:] != schema._masked_crc(body[:length]):
                    bad = "bad data CRC"
                    break
                records += 1
                offset += _HEADER + length + _FOOTER
        except (EOFError, OSError, zlib.error) as e:  # a cut or damaged GZIP stream
            bad = f"damaged GZIP stream ({e})"
        if bad is None:
            return RecordFileScan(path, records)
        # How many intact records follow (only countable when the damaged record's length is sound).
        skipped = -1
        if bad == "bad data CRC":
            skipped = 0
            try:
                while True:
                    header = f.read(_HEADER)
                    if len(header) < _HEADER or struct.pack("<I", struct.unpack("<QI", header)[1]) != \
                            schema._masked_crc(header[:8]):
                        break
                    body = f.read(struct.unpack("<Q", header[:8])[0] + _FOOTER)
                    if len(body) < _FOOTER or body[-_FOOTER:] != schema._masked_crc(body[:-_FOOTER]):
                        break
                    skipped += 1
            except (EOFError, OSError, zlib.error):
                pass
    return RecordFileScan(path, records, offset, bad, skipped)


def find_corrupt_files(files: Sequence[str]) -> List[RecordFileScan]:
    """The scans of the files that have a corrupt or truncated record, in order (reads every file once)."""
    return [scan for scan in map(scan_record_file, files) if scan.corrupt_at is not None]


def describe_corrupt(scan: RecordFileScan) -> str:
    return f"{scan.path}: corrupt TFRecord data at byte {scan.corrupt_at} ({scan.problem}, after {scan.records} good records)"


def _compression(path: str) -> str:
    with tf.io.gfile.GFile(path, "rb") as f:
        return "GZIP" if f.read(2) == schema.GZIP_MAGIC else ""


def pretraining_dataset(
    files: Sequence[str],
    max_seq_length: int,
    max_predictions_per_seq: int,
    batch_size: int,
    is_training: bool,
    input_context: Optional[tf.distribute.InputContext] = None,
    seed: Optional[int] = None,
    shuffle_buffer_size: int = SHUFFLE_BUFFER_SIZE,
    cycle_length: int = CYCLE_LENGTH,
    skip_corrupt_records: bool = False,
    drop_remainder: bool = True,
    fill_last_batch: bool = False,
    dynamic_masking: Optional[masking.MaskingOptions] = None,
    mask_seed: int = masking.EVAL_MASK_SEED,
) -> tf.data.Dataset:
    """Batches of the original's features (schema.parse_pretraining_example), for one input pipeline.

    Args:
      files: TFRecord files (plain or GZIP, not mixed), e.g. from expand_input_files.
      batch_size: examples per batch (per replica when used from the Trainer).
      is_training: repeat forever and shuffle; else read once, in order.
      input_context: the tf.distribute InputContext; None for a single pipeline.
      seed: makes file and record shuffling reproducible.
      skip_corrupt_records: read on past a corrupt or truncated record instead of failing;
        tf.data then drops the rest of that file (count them first with find_corrupt_files).
      drop_remainder: drop the last partial batch (fixed shapes, as the original on TPU); False
        keeps it (packing.packed_pretraining_dataset reads every instance of an evaluation).
      fill_last_batch: (evaluation) keep every instance and every batch's shape: the last batch
        is filled up with empty instances, and a float32 [batch] next_sentence_weights (0 for
        them) keeps them out of every loss and metric. Under XLA one program then serves all.
      dynamic_masking: the files hold records without masks (schema.DYNAMIC): each batch gets
        masks drawn by masking.draw_masks, keyed on (mask_seed, this input pipeline, the batch's
        index in it), so the same position in the input always gets the same masks.
    Returns a Dataset of dicts: int32 [batch, max_seq_length] input_ids, input_mask,
    segment_ids; int32 [batch, P] masked_lm_positions, masked_lm_ids; float32
    [batch, P] masked_lm_weights; int32 [batch, 1] next_sentence_labels.
    """
    files = list(files)
    compression = _compression(files[0])
    num_pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    shard_files = num_pipelines > 1 and len(files) >= num_pipelines

    def read(path):
        records = tf.data.TFRecordDataset(path, compression_type=compression)
        return records.ignore_errors() if skip_corrupt_records else records

    ds = tf.data.Dataset.from_tensor_slices(files)
    if shard_files:
        ds = ds.shard(num_pipelines, pipeline_id)
    if is_training:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True).repeat()
        ds = ds.interleave(
            read,
            cycle_length=min(cycle_length, len(files)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=seed is not None,
        )
    else:
        ds = ds.flat_map(read)
    if num_pipelines > 1 and not shard_files:
        ds = ds.shard(num_pipelines, pipeline_id)
    if is_training:
        ds = ds.shuffle(shuffle_buffer_size, seed=seed)
    kind = schema.STATIC if dynamic_masking is None else schema.DYNAMIC
    if fill_last_batch:
        ds = ds.map(lambda record: (record, 1.0))
        empty = schema.encode_example({name: [0.0 if dtype == schema.FLOAT32 else 0] * length for name, (dtype, length)
                                       in schema.feature_spec(max_seq_length, max_predictions_per_seq, kind).items()})
        ds = ds.concatenate(tf.data.Dataset.from_tensors((tf.constant(empty), 0.0)).repeat(batch_size - 1))
    ds = ds.batch(batch_size, drop_remainder=drop_remainder or fill_last_batch)

    def parse(records, weights=None):
        features = schema.parse_pretraining_example(records, max_seq_length, max_predictions_per_seq, kind)
        return features if weights is None else dict(features, next_sentence_weights=weights)

    if dynamic_masking:
        # The batch's index in this pipeline keys its masks; enumerate's count is part of the
        # iterator's saved state, and Dataset.skip on resume moves it as the batches it drops.
        def parse_and_mask(index, batch):
            features = parse(*batch) if isinstance(batch, tuple) else parse(batch)
            return masking.draw_masks(features, masking.batch_key(mask_seed, pipeline_id, index), dynamic_masking)

        ds = ds.enumerate().map(parse_and_mask, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def count_records(files: Sequence[str]) -> int:
    """Number of records in the files (reads them all; for run summaries of small data)."""
    total = 0
    for path in files:
        total += int(tf.data.TFRecordDataset(path, compression_type=_compression(path)).reduce(0, lambda n, _: n + 1))
    return total
