"""The pretraining TFRecord schema (docs/reference.md §6), defined once.

Writers and readers both use this module: `PretrainingRecordEncoder` turns an
instance into the bytes of one TFRecord record (a serialized
`tf.train.Example`) without importing TensorFlow, `parse_pretraining_example`
parses it back in a `tf.data` pipeline, and `inspect_record_file` reads the
lengths off the first record of a file.

Features (all zero-padded to a fixed length):
  input_ids            int64[max_seq_length]
  input_mask           int64[max_seq_length]
  segment_ids          int64[max_seq_length]
  masked_lm_positions  int64[max_predictions_per_seq]
  masked_lm_ids        int64[max_predictions_per_seq]
  masked_lm_weights    float32[max_predictions_per_seq]  1.0 real, 0.0 padding
  next_sentence_labels int64[1]                          0 = IsNext, 1 = random

Records for dynamic masking (create_pretraining_data.py --masking=dynamic) hold
the same features without the three masked_lm_* ones: the tokens unmasked,
one copy of each instance; run_pretraining.py draws the masks while reading
them (bert_tf/data/masking.py). A file's kind is read off its first record
(`inspect_record_file`: a record without masked_lm_positions is dynamic).

Why our own protobuf encoder: TensorFlow costs ~800 MB of resident memory per
process once imported, and a `tf.train.Example` built field by field costs
more CPU than the rest of the instance. The wire format is tiny and stable: an
`Example` holds `Features`, a map<string, Feature>; each of our features is a
packed `Int64List` or `FloatList`. Map entries are written in sorted key order,
which is what protobuf's deterministic serialization does, so our bytes equal
`example.SerializeToString(deterministic=True)` (checked by a test).
"""

from __future__ import annotations

import gzip
import os
import struct
from typing import Dict, Iterator, List, Sequence, Tuple

import numpy as np

INT64 = "int64"
FLOAT32 = "float32"
# The two kinds of records: masks written by the tool (the original's), or drawn while training.
STATIC, DYNAMIC = "static", "dynamic"
MASKINGS = (STATIC, DYNAMIC)


def feature_spec(max_seq_length: int, max_predictions_per_seq: int, masking: str = STATIC
                 ) -> Dict[str, Tuple[str, int]]:
    """Feature name -> (dtype, length), in the order the original writes them (dynamic: no masked_lm_*)."""
    spec = {
        "input_ids": (INT64, max_seq_length),
        "input_mask": (INT64, max_seq_length),
        "segment_ids": (INT64, max_seq_length),
        "masked_lm_positions": (INT64, max_predictions_per_seq),
        "masked_lm_ids": (INT64, max_predictions_per_seq),
        "masked_lm_weights": (FLOAT32, max_predictions_per_seq),
        "next_sentence_labels": (INT64, 1),
    }
    if masking == DYNAMIC:
        for name in PRED_FEATURES:
            del spec[name]
    return spec


SEQ_FEATURES = ("input_ids", "input_mask", "segment_ids")
PRED_FEATURES = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
FEATURE_NAMES = tuple(feature_spec(1, 1))
DYNAMIC_FEATURE_NAMES = tuple(feature_spec(1, 1, DYNAMIC))


# ------------------------------------------------------------------ protobuf wire format
def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_delimited(tag: int, payload: bytes) -> bytes:
    return bytes((tag,)) + _varint(len(payload)) + payload


# Field tags (field_number << 3 | wire type 2 = length-delimited).
_TAG_1 = 0x0A  # Example.features, Features.feature (map entry), MapEntry.key, *List.value
_TAG_2 = 0x12  # MapEntry.value, Feature.float_list
_TAG_3 = 0x1A  # Feature.int64_list
_FLOAT_ONE = struct.pack("<f", 1.0)
_FLOAT_ZERO = struct.pack("<f", 0.0)


def _int64_feature(packed: bytes) -> bytes:
    return _len_delimited(_TAG_3, _len_delimited(_TAG_1, packed))


def _float_feature(packed: bytes) -> bytes:
    return _len_delimited(_TAG_2, _len_delimited(_TAG_1, packed))


def _map_entry(key: bytes, feature: bytes) -> bytes:
    return _len_delimited(_TAG_1, _len_delimited(_TAG_1, key) + _len_delimited(_TAG_2, feature))


_SORTED_KEYS = tuple(sorted(FEATURE_NAMES))
_KEY_BYTES = {name: name.encode() for name in FEATURE_NAMES}


class PretrainingRecordEncoder:
    """Serializes pretraining instances as `tf.train.Example` bytes, fast.

    Args:
      max_seq_length: length of input_ids / input_mask / segment_ids.
      max_predictions_per_seq: length of the masked_lm_* features.
      vocab_size: ids are in [0, vocab_size); varints are precomputed for them.
      masking: STATIC (the original's schema) or DYNAMIC (no masked_lm_* features; the
        prediction arguments of `encode` are then ignored).
    """

    def __init__(self, max_seq_length: int, max_predictions_per_seq: int, vocab_size: int, masking: str = STATIC):
        self.max_seq_length = max_seq_length
        self.max_predictions_per_seq = max_predictions_per_seq
        self.masking = masking
        # Varint bytes of every value an int feature can hold (ids, positions)
        # and of every length a field can have (<= 10 bytes per value).
        limit = max(vocab_size, 10 * (max_seq_length + max_predictions_per_seq) + 1024)
        self._varints = [_varint(v) for v in range(limit + 1)]
        self._key_headers = {k: bytes((_TAG_1,)) + _varint(len(_KEY_BYTES[k])) + _KEY_BYTES[k]
                             for k in FEATURE_NAMES}

    def _packed_ints(self, values: Sequence[int]) -> bytes:
        return b"".join(map(self._varints.__getitem__, values))

    def _entry(self, key: str, list_tag: bytes, packed: bytes) -> bytes:
        """A map entry (key, Feature{int64_list or float_list: {value: packed}}), with table varints."""
        v = self._varints
        n = len(packed)
        inner_len = 1 + len(v[n]) + n
        feature_len = 1 + len(v[inner_len]) + inner_len
        header = self._key_headers[key]
        entry_len = len(header) + 1 + len(v[feature_len]) + feature_len
        return b"".join((b"\x0a", v[entry_len], header, b"\x12", v[feature_len], list_tag, v[inner_len], b"\x0a",
                         v[n], packed))

    def encode(self, input_ids: Sequence[int], num_tokens: int, num_segment_a: int,
               masked_lm_positions: Sequence[int], masked_lm_ids: Sequence[int], num_predictions: int,
               next_sentence_label: int) -> bytes:
        """One serialized `tf.train.Example`.

        Args:
          input_ids: int[max_seq_length] ids, already zero-padded.
          num_tokens: real tokens (input_mask is 1 for the first num_tokens).
          num_segment_a: tokens with segment 0 ([CLS] A [SEP]); the rest of
            the real tokens are segment 1, padding is 0.
          masked_lm_positions, masked_lm_ids: int[max_predictions_per_seq],
            zero-padded after the first num_predictions.
          num_predictions: real predictions (weight 1.0), the rest weight 0.0.
          next_sentence_label: 0 IsNext, 1 random next.
        """
        seq, pred = self.max_seq_length, self.max_predictions_per_seq
        pad = seq - num_tokens
        entry, i64, f32 = self._entry, b"\x1a", b"\x12"
        # Map entries in sorted key order (protobuf's deterministic order).
        predictions = () if self.masking == DYNAMIC else (
            entry("masked_lm_ids", i64, self._packed_ints(masked_lm_ids)),
            entry("masked_lm_positions", i64, self._packed_ints(masked_lm_positions)),
            entry("masked_lm_weights", f32, _FLOAT_ONE * num_predictions + _FLOAT_ZERO * (pred - num_predictions)),
        )
        body = b"".join((
            entry("input_ids", i64, self._packed_ints(input_ids)),
            entry("input_mask", i64, b"\x01" * num_tokens + b"\x00" * pad),
            *predictions,
            entry("next_sentence_labels", i64, b"\x01" if next_sentence_label else b"\x00"),
            entry("segment_ids", i64, b"\x00" * num_segment_a + b"\x01" * (num_tokens - num_segment_a)
                  + b"\x00" * pad),
        ))
        return b"\x0a" + self._varints[len(body)] + body


def encode_example(features: Dict[str, Sequence]) -> bytes:
    """A `tf.train.Example` with int64 / float features, serialized (slow path, for any values >= 0)."""
    entries = []
    for key in sorted(features):
        values = list(features[key])
        if values and isinstance(values[0], (float, np.floating)):
            feature = _float_feature(b"".join(struct.pack("<f", v) for v in values))
        else:
            feature = _int64_feature(b"".join(_varint(int(v)) for v in values))
        entries.append(_map_entry(key.encode(), feature))
    return _len_delimited(_TAG_1, b"".join(entries))


# ------------------------------------------------------------------ TFRecord framing
try:
    from google_crc32c import value as _crc32c
except ImportError:  # pure Python fallback: correct but slow
    _CRC_TABLE = []
    for _n in range(256):
        _c = _n
        for _ in range(8):
            _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
        _CRC_TABLE.append(_c)

    def _crc32c(data: bytes) -> int:
        crc = 0xFFFFFFFF
        for byte in data:
            crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
        return crc ^ 0xFFFFFFFF

_MASK_DELTA = 0xA282EAD8


def _masked_crc(data: bytes) -> bytes:
    crc = _crc32c(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF)


def frame_record(data: bytes) -> bytes:
    """One TFRecord record: length, masked CRC-32C of the length, data, masked CRC-32C of the data."""
    header = struct.pack("<Q", len(data))
    return header + _masked_crc(header) + data + _masked_crc(data)


GZIP_MAGIC = b"\x1f\x8b"


def _open_maybe_gzip(path: str):
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == GZIP_MAGIC else open(path, "rb")


def read_records(path: str) -> Iterator[bytes]:
    """The records of a local TFRecord file (plain or GZIP), with CRCs checked."""
    with _open_maybe_gzip(path) as f:
        for _, data in iter_framed(f, path):
            yield data


def iter_framed(f, path: str) -> Iterator[Tuple[bytes, bytes]]:
    """(framed record, its data) for each record of an open binary TFRecord stream, with CRCs checked."""
    while True:
        header = f.read(8)
        if not header:
            return
        if len(header) < 8:
            raise ValueError(f"{path}: truncated TFRecord header")
        (length,) = struct.unpack("<Q", header)
        header_crc = f.read(4)
        data = f.read(length)
        data_crc = f.read(4)
        if header_crc != _masked_crc(header) or len(data) != length or data_crc != _masked_crc(data):
            raise ValueError(f"{path}: corrupt TFRecord (bad length or CRC)")
        yield header + header_crc + data + data_crc, data


def gzip_stream(raw, compresslevel: int = 6):
    """A GZIP writer over an open binary file; no name or time in the header, so the bytes are reproducible."""
    return gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=compresslevel)


class RecordFileWriter:
    """Writes framed records to `path` through a temporary name; `close()` renames it into place.

    A run that fails calls `abort()`, which deletes the temporary file, so a
    half-written output never sits under the final name. With `gzip=True` the
    file is a GZIP stream (read it with `compression_type="GZIP"`); the header
    carries no name or time, so the bytes are reproducible.
    """

    def __init__(self, path: str, gzip_output: bool = False, compresslevel: int = 6):
        self.path = path
        self.tmp_path = f"{path}.incomplete-{os.getpid()}"
        self._raw = open(self.tmp_path, "wb")
        self._file = gzip_stream(self._raw, compresslevel) if gzip_output else self._raw
        self.num_records = 0

    def write(self, framed: bytes) -> None:
        self._file.write(framed)
        self.num_records += 1

    def close(self) -> None:
        if self._file is not self._raw:
            self._file.close()
        self._raw.close()
        os.replace(self.tmp_path, self.path)

    def abort(self) -> None:
        try:
            if self._file is not self._raw:
                self._file.close()
            self._raw.close()
        finally:
            if os.path.exists(self.tmp_path):
                os.remove(self.tmp_path)


# ------------------------------------------------------------------ readers (TensorFlow)
def parse_pretraining_example(serialized, max_seq_length: int, max_predictions_per_seq: int,
                              masking: str = STATIC):
    """Parses serialized examples (a scalar or a batch) into the original's tensors.

    Returns a dict of int32 tensors (input_ids, input_mask, segment_ids
    [.., max_seq_length]; masked_lm_positions, masked_lm_ids
    [.., max_predictions_per_seq]; next_sentence_labels [.., 1]) and float32
    masked_lm_weights [.., max_predictions_per_seq]. int64 is cast to int32 as
    the original's input_fn does (TPUs want int32). DYNAMIC records give the same without the
    masked_lm_* tensors (bert_tf.data.masking draws them).
    """
    import tensorflow as tf

    spec = {}
    for name, (dtype, length) in feature_spec(max_seq_length, max_predictions_per_seq, masking).items():
        spec[name] = tf.io.FixedLenFeature([length], tf.int64 if dtype == INT64 else tf.float32)
    if serialized.shape.rank == 0:
        parsed = tf.io.parse_single_example(serialized, spec)
    else:
        parsed = tf.io.parse_example(serialized, spec)
    return {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in parsed.items()}


def inspect_record_file(path: str) -> Dict[str, object]:
    """max_seq_length, max_predictions_per_seq (None for dynamic records) and masking (STATIC or
    DYNAMIC) of a pretraining TFRecord file, from its first record.

    Raises ValueError naming the file when it is empty or not in the schema.
    """
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "rb") as f:
        compression = "GZIP" if f.read(2) == GZIP_MAGIC else ""
    records = list(tf.data.TFRecordDataset(path, compression_type=compression).take(1))
    if not records:
        raise ValueError(f"{path}: no records")
    example = tf.train.Example.FromString(records[0].numpy())
    feature = example.features.feature
    masking = STATIC if any(name in feature for name in PRED_FEATURES) else DYNAMIC
    names = FEATURE_NAMES if masking == STATIC else DYNAMIC_FEATURE_NAMES
    missing = [name for name in names if name not in feature]
    if missing:
        raise ValueError(f"{path}: not a pretraining record, missing feature(s) {', '.join(missing)}")

    def length(name):
        dtype = feature_spec(1, 1)[name][0]
        return len(feature[name].int64_list.value if dtype == INT64 else feature[name].float_list.value)

    seq = {length(n) for n in SEQ_FEATURES}
    pred = {length(n) for n in PRED_FEATURES if masking == STATIC} or {None}
    if len(seq) != 1 or len(pred) != 1 or length("next_sentence_labels") != 1:
        raise ValueError(f"{path}: feature lengths disagree: "
                         + ", ".join(f"{n}={length(n)}" for n in names))
    return {"max_seq_length": seq.pop(), "max_predictions_per_seq": pred.pop(), "masking": masking}


def decode_example(serialized: bytes) -> Dict[str, List]:
    """Feature name -> list of values, via TensorFlow's protobuf (for tests and debugging)."""
    import tensorflow as tf

    example = tf.train.Example.FromString(serialized)
    out = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[name] = list(getattr(feature, kind).value)
    return out
