"""Extracts fixed contextual token features from a pretrained BERT (the original's flags and JSONL output).

  python extract_features.py --input_file=input.txt --output_file=output.jsonl \
      --vocab_file=uncased_L-12_H-768_A-12/vocab.txt --bert_config_file=uncased_L-12_H-768_A-12/bert_config.json \
      --init_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt --layers=-1,-2,-3,-4 --max_seq_length=128

--layer_combination writes one combined vector per token instead of one per layer
(the paper's Table 7): layer:-2, sum_last:4, concat_last:4 or scalar_mix
(with --scalar_mix_weights, one weight per layer; uniform by default).

--init_checkpoint may be an original TF1 checkpoint or its folder, a bert_tf model dir or checkpoint,
or a Hugging Face folder; --bert_config_file and --vocab_file default to the files beside it
(bert_config.json or config.json, vocab.txt), as for the fine-tuning scripts.
"""

import sys

from absl import app, flags

FLAGS = flags.FLAGS

flags.DEFINE_string("input_file", None, "One example per line; ' ||| ' separates a sentence pair.")
flags.DEFINE_string("output_file", None, "JSONL output, one line per input line.")
flags.DEFINE_string("layers", "-1,-2,-3,-4", "Comma-separated layer indexes (-1 = last layer).")
flags.DEFINE_string("layer_combination", None, "Combine layers into one vector per token (replaces --layers): "
                    "layer:<index>, sum_last:<k>, concat_last:<k> or scalar_mix.")
flags.DEFINE_list("scalar_mix_weights", None, "--layer_combination=scalar_mix: one weight per layer, first to "
                  "last (default 1/num_layers each).")
flags.DEFINE_string("bert_config_file", None, "bert_config.json (or a Hugging Face config.json) of the pretrained "
                    "model; default: the one beside --init_checkpoint.")
flags.DEFINE_integer("max_seq_length", 128, "Maximum total input length in WordPiece tokens (truncated beyond).")
flags.DEFINE_string("init_checkpoint", None, "Pretrained weights: a TF1 checkpoint or folder, ours, or a Hugging "
                    "Face folder.")
flags.DEFINE_string("vocab_file", None, "The vocabulary file the model was trained with; default: the vocab.txt "
                    "beside --init_checkpoint.")
flags.DEFINE_bool("do_lower_case", True, "Lower-case the input (True for uncased models).")
flags.DEFINE_integer("batch_size", 32, "Batch size for predictions.")
flags.DEFINE_bool("use_tpu", False, "Accepted for compatibility; ignored.")
flags.DEFINE_string("master", None, "Accepted for compatibility; ignored.")
flags.DEFINE_integer("num_tpu_cores", 8, "Accepted for compatibility; ignored.")
flags.DEFINE_bool("use_one_hot_embeddings", False, "Accepted for compatibility; ignored.")
flags.mark_flags_as_required(["input_file", "output_file", "init_checkpoint"])


def main(argv):
    del argv
    from bert_tf import checkpoints
    from bert_tf.configs import ConfigError
    from bert_tf.finetuning import FinetuneError, resolve_pretrained
    from bert_tf.models.feature_extraction import extract_features, parse_layer_combination, read_examples
    from bert_tf.tokenization import FullTokenizer, VocabError

    try:
        layers = [int(x) for x in FLAGS.layers.split(",")]
    except ValueError:
        print(
            f"extract_features.py: error: --layers={FLAGS.layers!r}: expected comma-separated integers", file=sys.stderr
        )
        sys.exit(1)
    try:
        combination = parse_layer_combination(FLAGS.layer_combination) if FLAGS.layer_combination else None
        mix_weights = [float(w) for w in FLAGS.scalar_mix_weights] if FLAGS.scalar_mix_weights else None
        if mix_weights is not None and (combination is None or combination.kind != "scalar_mix"):
            raise ValueError("--scalar_mix_weights needs --layer_combination=scalar_mix")
    except ValueError as e:
        print(f"extract_features.py: error: {e}", file=sys.stderr)
        sys.exit(1)
    try:
        # Any checkpoint kind, with its config and vocab found beside it, as for fine-tuning.
        pretrained = resolve_pretrained(FLAGS.init_checkpoint, FLAGS.bert_config_file, FLAGS.vocab_file)
        config = pretrained.config
        if FLAGS.max_seq_length > config.max_position_embeddings:
            raise ConfigError(
                f"--max_seq_length={FLAGS.max_seq_length} exceeds max_position_embeddings "
                f"{config.max_position_embeddings} of the bert_config"
            )
        tokenizer = FullTokenizer(pretrained.vocab_file, do_lower_case=FLAGS.do_lower_case)
        encoder = pretrained.build_encoder()  # left to right where the checkpoint's folder records it
        checkpoints.load_pretrained(encoder, pretrained.init_checkpoint, pretrained.fmt)
        examples = read_examples(FLAGS.input_file)
        count = extract_features(
            encoder, tokenizer, examples, FLAGS.output_file, layers, FLAGS.max_seq_length, FLAGS.batch_size,
            combination=combination, mix_weights=mix_weights,
        )
    except (checkpoints.CheckpointError, ConfigError, FinetuneError, VocabError, OSError, ValueError) as e:
        print(f"extract_features.py: error: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"wrote {count} lines to {FLAGS.output_file}")


if __name__ == "__main__":
    app.run(main)
