"""Answers text with an export of export_savedmodel.py (float or int8): a SavedModel, which needs only tensorflow
and tensorflow_text, or an ONNX export (--export_format=onnx), run by ONNX Runtime with the Python tokenizer
beside it (pip install -e ".[onnx]"); the same output rows from either.

  python predict.py --export_dir=export/mrpc --text="The cat sat." --text_b="A cat was sitting."
  python predict.py --export_dir=export/sst2 --input_file=sentences.txt          # one text per line
  python predict.py --export_dir=export/mrpc --input_file=pairs.tsv              # text<TAB>text_b
  python predict.py --export_dir=export/squad --text="Who wrote it?" --text_b="It was written by Ann."
  python predict.py --export_dir=export/swag --text="He opens the door." --text_b="He walks in.|He flies."

Output: TSV (default) or one JSON object per line (--format=json). Multiple
choice takes its choices in --text_b (or the second column) separated by "|".
--input_file may also be JSON Lines (.jsonl: {"text": ..., "text_b": ...}).

On Apache Beam (README "Beyond one machine"): --runner plus --output_file; --input_file takes
comma-separated globs of text/TSV/JSONL files; JSONL shards <output_file>-0000i-of-0000N hold
the rows --format=json prints, file by file, in order:

  python predict.py --export_dir=export/sst2 --input_file='in/*.tsv' --output_file=out/pred.jsonl \
      --runner=DirectRunner --num_workers=2
"""

import logging
import os
import sys

from absl import app, flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import bert_flags  # noqa: E402  (imports bert_tf first, before TensorFlow: quiet start-up, bert_tf/console.py)
from bert_tf.errors import ExportError, InputDataError  # noqa: E402
from bert_tf.progress import Progress  # noqa: E402
from bert_tf.serving.predictor import iter_rows, json_line, load, rows_of, run_batch  # noqa: E402

FLAGS = flags.FLAGS

flags.DEFINE_string("export_dir", None, "A SavedModel or ONNX export written by export_savedmodel.py.")
flags.DEFINE_string("text", None, "A text (SQuAD: the question; multiple choice: the context).")
flags.DEFINE_string("text_b", None, "The second text of a pair (SQuAD: the context; multiple choice: choices a|b|c).")
flags.DEFINE_string("input_file", None, "A UTF-8 file: one text per line, or text<TAB>text_b.")
flags.DEFINE_enum("format", "tsv", ["tsv", "json"], "Output format.")
flags.DEFINE_integer("batch_size", 32, "Texts per call.")
flags.DEFINE_string("output_file", None, "With --runner: JSONL output, files <output_file>-0000i-of-0000N.")
flags.DEFINE_integer("num_output_shards", 1, "With --runner: output files; rows in input order across them.")
flags.DEFINE_integer("num_workers", 0, "With --runner=DirectRunner: local worker processes (0 = all cores).")
bert_flags.define_beam_flags()
flags.mark_flag_as_required("export_dir")



def read_inputs():
    if bool(FLAGS.text is not None) == bool(FLAGS.input_file):
        raise ExportError("pass exactly one of --text and --input_file")
    if FLAGS.text is not None:
        return [(FLAGS.text, FLAGS.text_b or "")]
    return list(iter_rows(FLAGS.input_file))


def run_on_beam(beam_args):
    from bert_tf.beam import inference

    if not FLAGS.input_file or not FLAGS.output_file or FLAGS.text is not None:
        raise ExportError("--runner needs --input_file and --output_file (not --text)")
    try:
        summary = inference.run_predict(FLAGS.export_dir, FLAGS.input_file, FLAGS.output_file, FLAGS.batch_size,
                                        FLAGS.num_output_shards, beam_args, FLAGS.runner, FLAGS.num_workers)
    except InputDataError as e:
        raise ExportError(str(e)) from None
    print(f"wrote {summary['rows']} rows to {len(summary['output_files'])} file(s) {FLAGS.output_file}-*",
          file=sys.stderr)


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
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("bert_tf.progress").setLevel(logging.INFO)
    logging.getLogger("bert_tf.beam").setLevel(logging.INFO)  # (a Beam job's progress, bert_tf/beam/common.py)
    beam_args = bert_flags.beam_args(argv, "predict.py")
    try:
        if FLAGS.runner:
            run_on_beam(beam_args)
            return
        inputs = read_inputs()
        serve, metadata = load(FLAGS.export_dir)
        kind = metadata["export_type"]
        has_b = any(b for _, b in inputs)
        if kind == "classification" and FLAGS.format == "tsv":
            header = ["text"] + (["text_b"] if has_b else []) + ["label"]
            print("\t".join(header + [f"p_{label}" for label in metadata["label_list"]]))
        # Long inputs: a line on stderr every 30 s (texts done, rate, ETA); never a bar, the rows may be on the terminal.
        progress = Progress(len(inputs), "texts", live=False, tenths=False)
        for start in range(0, len(inputs), FLAGS.batch_size):
            batch = inputs[start:start + FLAGS.batch_size]
            out = run_batch(serve, kind, metadata, batch)
            for row in rows_of(kind, metadata, out, batch):
                print(json_line(row) if FLAGS.format == "json" else tsv_line(kind, row, has_b))
            progress.update(start + len(batch))
    except ExportError as e:
        print(f"predict.py: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    app.run(main, flags_parser=bert_flags.parse_flags_and_beam_options)
