"""Exports a self-contained SavedModel that serves raw text (vocab, casing, max_seq_length inside).

  # a fine-tuned model_dir (bert_config.json, vocab.txt, bert_tf_info.json, ckpt-<step>)
  python export_savedmodel.py --model_dir=out/mrpc --export_dir=export/mrpc
  # its encoder only, TF-Hub style
  python export_savedmodel.py --model_dir=out/mrpc --task_type=encoder --export_dir=export/mrpc_encoder
  # a pretrained encoder: original TF1 checkpoint, Hugging Face folder, or ours
  python export_savedmodel.py --init_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt \
      --bert_config_file=uncased_L-12_H-768_A-12/bert_config.json \
      --vocab_file=uncased_L-12_H-768_A-12/vocab.txt --do_lower_case=True --export_dir=export/encoder
  # a Hugging Face folder: its config.json and vocab.txt are found there
  python export_savedmodel.py --init_checkpoint=all-MiniLM-L6-v2/ --export_dir=export/minilm
  # the same signatures with the Transformer blocks' dense layers in dynamic int8 (x86 TensorFlow with oneDNN)
  python export_savedmodel.py --model_dir=out/mrpc --export_dir=export/mrpc_int8 --quantize=int8
  # ONNX for ONNX Runtime (CPU latency): model.onnx + assets/vocab.txt + assets/bert_tf_export.json
  python export_savedmodel.py --model_dir=out/mrpc --export_dir=export/mrpc_onnx --export_format=onnx --quantize=int8
  # TF-Hub's BERT workflow: the encoder export is fine-tunable with hub.KerasLayer(..., trainable=True);
  # its preprocessor (strings -> input_word_ids / input_mask / input_type_ids; tokenize; bert_pack_inputs)
  python export_savedmodel.py --init_checkpoint=all-MiniLM-L6-v2/ --task_type=preprocessor \
      --export_dir=export/minilm_preprocess

Load it with only `import tensorflow as tf, tensorflow_text`: `tf.saved_model.load(export_dir)
.signatures["serving_default"](text_a=tf.constant([...]), text_b=tf.constant([""]))`.
"""

import os
import sys

from absl import app, flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FLAGS = flags.FLAGS

flags.DEFINE_string("model_dir", None, "A fine-tuned (or pretraining) model_dir to export.")
flags.DEFINE_string("init_checkpoint", None, "Or: a pretrained checkpoint (TF1, Hugging Face, ours); exports the encoder.")
flags.DEFINE_string("bert_config_file", None, "bert_config.json (or a Hugging Face config.json) for "
                    "--init_checkpoint; default: the one beside it.")
flags.DEFINE_string("vocab_file", None, "vocab.txt for --init_checkpoint; default: the one beside it.")
flags.DEFINE_bool("do_lower_case", True, "Casing for --init_checkpoint (a model_dir records its own).")
flags.DEFINE_string("export_dir", None, "Where to write the SavedModel (written to a temporary name, then renamed).")
flags.DEFINE_integer("max_seq_length", None,
                     "Sequence length of the serving inputs. Default: the model_dir's; 128 for --init_checkpoint.")
flags.DEFINE_enum("task_type", None, ["encoder", "preprocessor", "classification", "regression", "span",
                                       "multiple_choice", "tagging"],
                  "What to export. Default: the model_dir's task (its encoder for pretraining). preprocessor: "
                  "the TF-Hub BERT preprocessor of the model's vocab and casing (strings -> the encoder's inputs "
                  "at --max_seq_length).")
flags.DEFINE_integer("max_query_length", 64, "span: question pieces kept.")
flags.DEFINE_integer("max_answer_length", 30, "span: longest answer in pieces.")
flags.DEFINE_bool("overwrite", False, "Replace a non-empty --export_dir.")
flags.DEFINE_enum("quantize", "none", ["none", "int8"],
                  "none: float32 as trained. int8: the Transformer blocks' dense layers run in dynamic int8 "
                  "(int8 weights per output column, uint8 activations per call; embeddings, LayerNorm, softmax, "
                  "heads stay float32). Needs an x86 TensorFlow with oneDNN (the pip wheels), to export and to serve.")
flags.DEFINE_enum("export_format", "savedmodel", ["savedmodel", "onnx"],
                  "savedmodel: TF Serving, TF-Hub, Vertex, batch jobs (raw text in). onnx: model.onnx for ONNX Runtime "
                  "(CPU latency; token ids in, tokenized in Python by predict.py), with vocab and metadata beside "
                  "it; --quantize=int8 is then ONNX Runtime's dynamic int8. Needs pip install -e \".[onnx]\".")
flags.DEFINE_bool("onnx_fusions", True, "onnx: ONNX Runtime's fused LayerNorm and GELU ops in place of their op chains (off: ONNX's standard ops only).")
flags.mark_flag_as_required("export_dir")

DEFAULT_ENCODER_SEQ_LENGTH = 128


def fail(message: str):
    print(f"export_savedmodel.py: error: {message}", file=sys.stderr)
    sys.exit(1)


def main(argv):
    del argv
    # The gate, before TensorFlow loads (the format's and int8's runtime checks need the export module).
    if bool(FLAGS.model_dir) == bool(FLAGS.init_checkpoint):
        fail("pass exactly one of --model_dir and --init_checkpoint")
    if FLAGS.init_checkpoint and FLAGS.task_type not in (None, "encoder", "preprocessor"):
        fail("--init_checkpoint exports an encoder or a preprocessor; use --model_dir for task models")
    from bert_tf import export
    from bert_tf.errors import BertError

    try:
        if FLAGS.model_dir:
            out = export.export_model_dir(
                FLAGS.model_dir, FLAGS.export_dir, export_type=FLAGS.task_type, max_seq_length=FLAGS.max_seq_length,
                overwrite=FLAGS.overwrite, max_query_length=FLAGS.max_query_length,
                max_answer_length=FLAGS.max_answer_length, quantize=FLAGS.quantize,
                export_format=FLAGS.export_format, onnx_fusions=FLAGS.onnx_fusions)
        else:
            out = export.export_checkpoint(
                FLAGS.init_checkpoint, FLAGS.bert_config_file, FLAGS.vocab_file, FLAGS.do_lower_case,
                FLAGS.export_dir, FLAGS.max_seq_length or DEFAULT_ENCODER_SEQ_LENGTH, overwrite=FLAGS.overwrite,
                quantize=FLAGS.quantize, export_type=FLAGS.task_type or "encoder",
                export_format=FLAGS.export_format, onnx_fusions=FLAGS.onnx_fusions)
    except BertError as e:  # (an export, a checkpoint, a config or a vocab that cannot be used)
        fail(str(e))
    kind = "ONNX export" if FLAGS.export_format == "onnx" else "SavedModel"
    print(f"wrote {kind} {out}" + (" (int8)" if FLAGS.quantize == "int8" else ""))


if __name__ == "__main__":
    app.run(main)
