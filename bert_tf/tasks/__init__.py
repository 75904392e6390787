"""Fine-tuning tasks: read task files -> examples -> features; post-processing; metrics.

Modules (import the one you need; this package imports nothing heavy):
  glue           GLUE / XNLI / your own TSV-CSV classification and regression
  squad          SQuAD v1.1 / v2.0 reading, featurizing and answer post-processing
  squad_metrics  the official SQuAD v1.1 and v2.0 evaluation
  swag           SWAG multiple choice
  conll          CoNLL-2003 named-entity recognition and conlleval scoring

Everything here is plain Python / numpy, so the runners can wrap the features in
`tf.data` however they batch (fixed shapes on TPU, by length elsewhere).
"""


class TaskDataError(ValueError):
    """A task file that cannot be read: the message names the file, the line or id, and what was expected."""


# Label id of word pieces (and [CLS]/[SEP]/padding) that carry no label in token
# classification; the same convention as other BERT tooling, so masks are `label_ids != IGNORE_LABEL_ID`.
IGNORE_LABEL_ID = -100


def read_text(path: str) -> str:
    """The contents of a UTF-8 text file (local or gs://), a leading BOM dropped.

    Raises TaskDataError naming the file, and the line of the first byte that is not UTF-8.
    """
    try:
        if "://" in str(path):
            import tensorflow as tf  # only remote paths (gs://...) need tf.io.gfile

            try:
                with tf.io.gfile.GFile(path, "rb") as f:
                    data = f.read()
            except tf.errors.OpError as e:
                raise OSError(e.message) from None
        else:
            with open(path, "rb") as f:
                data = f.read()
    except OSError as e:
        raise TaskDataError(f"{path}: cannot read file ({e.strerror or e})") from None
    return decode_utf8(data, path)


def decode_utf8(data: bytes, path: str) -> str:
    """`data` decoded as UTF-8 without a leading BOM; a TaskDataError names the first bad line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise TaskDataError(
            f"{path}:{line}: byte 0x{data[e.start]:02x} is not valid UTF-8 (expected a UTF-8 text file)"
        ) from None
    return text[1:] if text.startswith("\ufeff") else text
