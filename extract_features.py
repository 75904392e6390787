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

On Apache Beam (README "Beyond one machine"): --runner (and Beam's pipeline options); --input_file
takes comma-separated globs; JSONL shards <output_file>-0000i-of-0000N hold the lines the
single-process run writes, file by file, in order (linex_index counts lines within each file).
"""

import sys

from absl import app, flags

import bert_flags

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
flags.DEFINE_integer("num_output_shards", 1, "With --runner: JSONL files <output_file>-0000i-of-0000N, rows in "
                     "input order across them.")
flags.DEFINE_integer("num_workers", 0, "With --runner=DirectRunner: local worker processes (0 = all cores).")
bert_flags.define_beam_flags()
flags.mark_flags_as_required(["input_file", "output_file", "init_checkpoint"])


def main(argv):
    beam_args = bert_flags.beam_args(argv, "extract_features.py")
    try:  # the gate: before TensorFlow loads
        layers = [int(x) for x in FLAGS.layers.split(",")]
    except ValueError:
        print(
            f"extract_features.py: error: --layers={FLAGS.layers!r}: expected comma-separated integers", file=sys.stderr
        )
        sys.exit(1)
    # (parse_layer_combination's module, bert_tf.models, imports TensorFlow: these checks come after it)
    from bert_tf.feature_extraction import ExtractorSettings, read_examples, write_features
    from bert_tf.models.layer_combination import parse_layer_combination

    try:
        combination = parse_layer_combination(FLAGS.layer_combination) if FLAGS.layer_combination else None
        mix_weights = [float(w) for w in FLAGS.scalar_mix_weights] if FLAGS.scalar_mix_weights else None
        if mix_weights is not None and (combination is None or combination.kind != "scalar_mix"):
            raise ValueError("--scalar_mix_weights needs --layer_combination=scalar_mix")
    except ValueError as e:
        print(f"extract_features.py: error: {e}", file=sys.stderr)
        sys.exit(1)
    settings = ExtractorSettings(FLAGS.init_checkpoint, FLAGS.bert_config_file, FLAGS.vocab_file, FLAGS.do_lower_case,
                                 FLAGS.max_seq_length, tuple(layers), FLAGS.layer_combination,
                                 None if mix_weights is None else tuple(mix_weights))
    try:
        if FLAGS.runner:
            from bert_tf.beam import inference

            summary = inference.run_features(settings, FLAGS.input_file, FLAGS.output_file, FLAGS.batch_size,
                                             FLAGS.num_output_shards, beam_args, FLAGS.runner, FLAGS.num_workers)
            print(f"wrote {summary['rows']} lines to {len(summary['output_files'])} file(s) {FLAGS.output_file}-*")
            return
        extractor = settings.build()
        count = write_features(extractor, read_examples(FLAGS.input_file), FLAGS.output_file, FLAGS.batch_size)
    except (ValueError, OSError) as e:  # every BertError (bert_tf/errors.py) is a ValueError
        print(f"extract_features.py: error: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"wrote {count} lines to {FLAGS.output_file}")


if __name__ == "__main__":
    app.run(main, flags_parser=bert_flags.parse_flags_and_beam_options)
