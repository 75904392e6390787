"""Converts BERT checkpoints between the original TF1 layout, Hugging Face and bert_tf.

  # an original (Google) checkpoint -> ours
  python convert_checkpoint.py --input_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt \
      --bert_config_file=uncased_L-12_H-768_A-12/bert_config.json --output_checkpoint=out/ckpt-0
  # Hugging Face (a folder with model.safetensors + config.json) -> ours, or -> original TF1
  python convert_checkpoint.py --input_checkpoint=all-MiniLM-L6-v2/ --output_checkpoint=out/bert_model.ckpt \
      --output_format=tf1
  # ours -> original TF1 names, loadable by the original run_classifier.py / run_squad.py
  python convert_checkpoint.py --input_checkpoint=model_dir/ckpt-10000 --bert_config_file=model_dir/bert_config.json \
      --output_checkpoint=export/bert_model.ckpt --output_format=tf1
  # a bert_tf model dir (pretrained or fine-tuned) or an original checkpoint -> a Hugging Face folder
  python convert_checkpoint.py --input_checkpoint=model_dir --output_checkpoint=hf_model --output_format=hf

The heads the input has (MLM/NSP, a classifier, SQuAD) are carried across.
bert_config.json and vocab.txt are written beside a tf1/ours output; an hf output is a
folder with model.safetensors, config.json, vocab.txt (and tokenizer_config.json when the
casing is known) that `transformers` loads with from_pretrained. --bert_config_file may be
an original bert_config.json or a Hugging Face config.json; it defaults to the one beside
the input.
"""

import sys

from absl import app, flags

FLAGS = flags.FLAGS

flags.DEFINE_string(
    "input_checkpoint", None,
    "Input: a TF1/our checkpoint prefix or folder (a bert_tf model dir), or a HF folder/.safetensors."
)
flags.DEFINE_enum("input_format", "auto", ["auto", "tf1", "hf", "ours"], "Format of --input_checkpoint.")
flags.DEFINE_string("output_checkpoint", None,
                    "Output checkpoint prefix, e.g. out/bert_model.ckpt; for --output_format=hf, a folder.")
flags.DEFINE_enum("output_format", "ours", ["ours", "tf1", "hf"],
                  "Format to write. tf1 of a gelu_exact model says gelu (tanh) with a warning: the original "
                  "cannot run the erf GELU.")
flags.DEFINE_string(
    "bert_config_file", None,
    "bert_config.json (or a Hugging Face config.json) of the input; default: the one beside the input."
)
flags.DEFINE_string("vocab_file", None, "vocab.txt to copy beside the output (default: the one beside the input).")
flags.mark_flags_as_required(["input_checkpoint", "output_checkpoint"])


def main(argv):
    del argv
    from bert_tf import checkpoints
    from bert_tf.configs import BertConfig
    from bert_tf.errors import CheckpointError, ConfigError

    try:
        config = BertConfig.from_json_file(FLAGS.bert_config_file) if FLAGS.bert_config_file else None
        out = checkpoints.convert_checkpoint(
            FLAGS.input_checkpoint,
            FLAGS.output_checkpoint,
            output_format=FLAGS.output_format,
            bert_config=config,
            input_format=None if FLAGS.input_format == "auto" else FLAGS.input_format,
            vocab_file=FLAGS.vocab_file,
        )
    except (CheckpointError, ConfigError, FileNotFoundError) as e:
        print(f"convert_checkpoint.py: error: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"wrote {FLAGS.output_format} checkpoint {out}")


if __name__ == "__main__":
    app.run(main)
