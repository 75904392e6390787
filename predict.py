"""Answers text with an exported SavedModel; needs only tensorflow and tensorflow_text (not bert_tf).

  python predict.py --export_dir=export/mrpc --text="The cat sat." --text_b="A cat was sitting."
  python predict.py --export_dir=export/sst2 --input_file=sentences.txt          # one text per line
  python predict.py --export_dir=export/mrpc --input_file=pairs.tsv              # text<TAB>text_b
  python predict.py --export_dir=export/squad --text="Who wrote it?" --text_b="It was written by Ann."
  python predict.py --export_dir=export/swag --text="He opens the door." --text_b="He walks in.|He flies."

Output: TSV (default) or one JSON object per line (--format=json). Multiple
choice takes its choices in --text_b (or the second column) separated by "|".
"""

import json
import os
import sys

from absl import app, flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
try:  # not needed; where installed, it hides TensorFlow's start-up noise on CPU machines (bert_tf/console.py)
    import bert_tf  # noqa: F401
except ImportError:
    pass

FLAGS = flags.FLAGS

flags.DEFINE_string("export_dir", None, "A SavedModel written by export_savedmodel.py.")
flags.DEFINE_string("text", None, "A text (SQuAD: the question; multiple choice: the context).")
flags.DEFINE_string("text_b", None, "The second text of a pair (SQuAD: the context; multiple choice: choices a|b|c).")
flags.DEFINE_string("input_file", None, "A UTF-8 file: one text per line, or text<TAB>text_b.")
flags.DEFINE_enum("format", "tsv", ["tsv", "json"], "Output format.")
flags.DEFINE_integer("batch_size", 32, "Texts per call.")
flags.mark_flag_as_required("export_dir")

METADATA_FILE = "bert_tf_export.json"
CHOICE_SEPARATOR = "|"


class PredictError(ValueError):
    pass


def read_inputs():
    if bool(FLAGS.text is not None) == bool(FLAGS.input_file):
        raise PredictError("pass exactly one of --text and --input_file")
    if FLAGS.text is not None:
        return [(FLAGS.text, FLAGS.text_b or "")]
    if not os.path.isfile(FLAGS.input_file):
        raise PredictError(f"{FLAGS.input_file}: input_file not found")
    rows = []
    with open(FLAGS.input_file, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n").rstrip("\r")
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) > 2:
                raise PredictError(f"{FLAGS.input_file}:{number}: expected text or text<TAB>text_b, got {len(parts)} columns")
            rows.append((parts[0], parts[1] if len(parts) == 2 else ""))
    return rows


def load(export_dir):
    metadata_file = os.path.join(export_dir, "assets", METADATA_FILE)
    if "://" in export_dir:  # gs:// and other TensorFlow file systems
        import tensorflow as tf

        try:
            found = all(tf.io.gfile.exists(p) for p in (os.path.join(export_dir, "saved_model.pb"), metadata_file))
        except tf.errors.OpError as e:
            reason = " ".join(e.message.split()).split(" when reading")[0].split("error details: ")[-1]
            raise PredictError(f"{export_dir}: cannot reach or read it ({reason[:200]})") from None
        open_file = tf.io.gfile.GFile
    else:
        found = all(os.path.isfile(p) for p in (os.path.join(export_dir, "saved_model.pb"), metadata_file))
        open_file = open
    if not found:
        raise PredictError(f"{export_dir}: not a SavedModel written by export_savedmodel.py")
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizer ops)

    with open_file(metadata_file, "rb") as f:
        metadata = json.loads(f.read().decode("utf-8"))
    return tf.saved_model.load(export_dir).signatures["serving_default"], metadata


def run_batch(serve, kind, metadata, batch):
    import tensorflow as tf

    a = tf.constant([x for x, _ in batch])
    b = [y for _, y in batch]
    if kind == "span":
        out = serve(question=a, context=tf.constant(b))
    elif kind == "multiple_choice":
        n = metadata["num_choices"]
        choices = [y.split(CHOICE_SEPARATOR) for y in b]
        if any(len(c) != n for c in choices):
            raise PredictError(f"multiple choice: every input needs {n} choices separated by {CHOICE_SEPARATOR!r}")
        out = serve(context=a, choices=tf.constant(choices))
    elif kind == "tagging":
        out = serve(text=a)
    else:
        out = serve(text_a=a, text_b=tf.constant(b))
    return {k: v.numpy() for k, v in out.items()}


def rows_of(kind, metadata, out, batch):
    """One dict per input with the answer in plain Python types."""
    for i, (a, b) in enumerate(batch):
        row = {"text": a}
        if b:
            row["text_b"] = b
        if kind == "classification":
            row["label"] = out["label"][i].decode("utf-8")
            row["probabilities"] = dict(zip(metadata["label_list"], map(float, out["probabilities"][i]), strict=True))
        elif kind == "regression":
            row["score"] = float(out["score"][i])
        elif kind == "span":
            row["answer"] = out["answer_text"][i].decode("utf-8")
            row["score"] = float(out["answer_score"][i])
        elif kind == "multiple_choice":
            row["choice"] = int(out["choice"][i])
            row["probabilities"] = [float(p) for p in out["probabilities"][i]]
        elif kind == "tagging":
            n = int(out["num_words"][i])
            row["words"] = [w.decode("utf-8") for w in out["words"][i][:n]]
            row["tags"] = [t.decode("utf-8") for t in out["tags"][i][:n]]
        else:  # encoder
            row["pooled_output"] = [float(x) for x in out["pooled_output"][i]]
        yield row


def tsv_line(kind, row, has_b):
    fields = [row["text"]] + ([row.get("text_b", "")] if has_b else [])
    if kind == "classification":
        fields += [row["label"]] + [f"{p:.6f}" for p in row["probabilities"].values()]
    elif kind == "regression":
        fields += [f"{row['score']:.6f}"]
    elif kind == "span":
        fields += [row["answer"], f"{row['score']:.4f}"]
    elif kind == "multiple_choice":
        fields += [str(row["choice"])] + [f"{p:.6f}" for p in row["probabilities"]]
    elif kind == "tagging":
        fields += [" ".join(f"{w}/{t}" for w, t in zip(row["words"], row["tags"], strict=True))]
    else:
        fields += [" ".join(f"{x:.6f}" for x in row["pooled_output"])]
    return "\t".join(f.replace("\t", " ").replace("\n", " ") for f in fields)


def main(argv):
    del argv
    try:
        inputs = read_inputs()
        serve, metadata = load(FLAGS.export_dir)
        kind = metadata["export_type"]
        has_b = any(b for _, b in inputs)
        if kind == "classification" and FLAGS.format == "tsv":
            header = ["text"] + (["text_b"] if has_b else []) + ["label"]
            print("\t".join(header + [f"p_{label}" for label in metadata["label_list"]]))
        for start in range(0, len(inputs), FLAGS.batch_size):
            batch = inputs[start:start + FLAGS.batch_size]
            out = run_batch(serve, kind, metadata, batch)
            for row in rows_of(kind, metadata, out, batch):
                print(json.dumps(row, ensure_ascii=False) if FLAGS.format == "json" else tsv_line(kind, row, has_b))
    except PredictError as e:
        print(f"predict.py: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
