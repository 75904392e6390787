"""Pretrain BERT (masked LM + next sentence prediction) on create_pretraining_data.py's TFRecords.

--objective picks the paper's ablations (§5.1) on the same records: mlm_nsp
(default), mlm (No NSP; = --use_next_sentence_prediction=False), ltr (a
left-to-right LM with a causal attention mask, no NSP; fine-tuning keeps the mask).

The original's flags keep their meaning (batch sizes are global); additions pick
the distribution strategy, optimizer, precision and more. A run resumes from
the latest checkpoint in --output_dir; SIGTERM saves a checkpoint and exits 143.

Records without masks (create_pretraining_data.py --masking=dynamic) get them drawn each time a
sequence is read (--masked_lm_prob, --do_whole_word_mask; needs --vocab_file); evaluation's are the
same on every run.

Continued pretraining: --init_checkpoint (an original bert_model.ckpt, a Hugging
Face folder or .safetensors, or a bert_tf model dir) with or without MLM/NSP heads;
bert_config, vocab and casing come from its folder unless given; the heads it
lacks start fresh (one log line names them) and so does the optimizer. A
checkpoint already in --output_dir is resumed instead (the log says so).

  python run_pretraining.py --input_file=/tmp/tf_examples.tfrecord \
    --output_dir=/tmp/pretraining_output --do_train=True --do_eval=True \
    --bert_config_file=bert_config.json --train_batch_size=32 \
    --max_seq_length=128 --max_predictions_per_seq=20 --num_train_steps=20 \
    --num_warmup_steps=10 --learning_rate=2e-5

  python run_pretraining.py --init_checkpoint=<HF folder> --input_file=domain.tfrecord \
    --output_dir=/tmp/continued --do_train=True --do_eval=True --objective=mlm ...
"""

from absl import app, flags

import bert_flags
import bert_setup
from bert_flags import FLAGS, fail

# --- the original's flags
flags.DEFINE_string("bert_config_file", None, "The config json file corresponding to the pre-trained BERT model "
                    "(an original bert_config.json or a Hugging Face config.json); default with "
                    "--init_checkpoint: the one beside it.")
flags.DEFINE_string("input_file", None, "Input TF example files (comma-separated globs).")
flags.DEFINE_string("output_dir", None, "The output directory where the model checkpoints will be written.")
bert_flags.define_overwrite_flag()
flags.DEFINE_string("init_checkpoint", None, "Initial weights: an original bert_model.ckpt, a Hugging Face "
                    "folder or .safetensors, or a bert_tf model dir or checkpoint. Heads it lacks and the "
                    "optimizer start fresh; a checkpoint in --output_dir is resumed instead.")
flags.DEFINE_integer("max_seq_length", 128, "The maximum total input sequence length after WordPiece "
                     "tokenization. Must match the data.")
flags.DEFINE_integer("max_predictions_per_seq", 20, "Maximum number of masked LM predictions per sequence. "
                     "Must match the data.")
flags.DEFINE_bool("do_train", False, "Whether to run training.")
flags.DEFINE_bool("do_eval", False, "Whether to run eval on the dev set.")
flags.DEFINE_integer("train_batch_size", 32, "Total batch size for training.")
flags.DEFINE_integer("eval_batch_size", 8, "Total batch size for eval.")
flags.DEFINE_integer("num_train_steps", 100000, "Number of training steps.")
flags.DEFINE_integer("num_warmup_steps", 10000, "Number of warmup steps.")
flags.DEFINE_integer("max_eval_steps", 100, "Maximum number of eval steps.")
bert_flags.define_optimizer_flags(learning_rate=5e-5)
bert_flags.define_tpu_and_strategy_flags()
# --- additions
flags.DEFINE_string("eval_input_file", None, "Held-out TF example files for eval (default: --input_file, "
                    "as the original).")
flags.DEFINE_bool("use_next_sentence_prediction", True, "Train the next-sentence head too (False: the paper's "
                  "'No NSP' ablation).")
flags.DEFINE_enum("objective", "mlm_nsp", ["mlm_nsp", "mlm", "ltr"], "Pretraining objective: masked LM + next "
                  "sentence, masked LM only (No NSP), or left-to-right LM with a causal mask (recorded in "
                  "bert_tf_info.json; fine-tuning an ltr model keeps the causal mask).")
flags.DEFINE_string("vocab_file", None, "The vocab the data was made with; copied into --output_dir so "
                    "fine-tuning finds it (default with --init_checkpoint: the one beside it). A vocab made by "
                    "create_vocab.py --extend_vocab from the checkpoint's: new tokens start from their old pieces.")
flags.DEFINE_bool("do_lower_case", None, "Casing of the data; recorded in --output_dir/bert_tf_info.json "
                  "(default with --init_checkpoint: the casing it records).")
bert_flags.define_packing_flags("instances", "MAX_SEQUENCES_PER_ROW")
flags.DEFINE_enum("masking", "auto", ["auto", "static", "dynamic"], "auto: as the records say; static: records "
                  "with masks (the original's) are expected; dynamic: records without masks "
                  "(create_pretraining_data.py --masking=dynamic) are expected, their masks drawn each time a "
                  "sequence is read (needs --vocab_file).")
flags.DEFINE_float("masked_lm_prob", 0.15, "Records without masks: the share of tokens masked (capped at "
                   "--max_predictions_per_seq).")
flags.DEFINE_bool("do_whole_word_mask", False, "Records without masks: mask whole words (a word and its ## "
                  "pieces) rather than word pieces.")
flags.DEFINE_bool("skip_corrupt_records", False, "Read on past corrupt or truncated TFRecord data (the files are "
                  "CRC-checked first and what is skipped is logged) instead of stopping with an error.")

def pretraining_config():
    """The gate: the PretrainingConfig the flags describe, checked (one-line exits) before TensorFlow loads.

    With --init_checkpoint the model's config, vocab and casing come from the checkpoint's folder, which is
    read after set-up (a checkpoint's format is read with TensorFlow's checkpoint reader): the gate checks
    the values, bert_setup.pretraining_settings the model's fit once resolved. The input globs are expanded
    after set-up too (gs:// globs need TensorFlow's file system)."""
    from bert_tf.configs import BertConfig
    from bert_tf.errors import ConfigError
    from bert_tf.runners.pretraining_config import PretrainingConfig

    required = ("input_file", "output_dir") if FLAGS.init_checkpoint else ("bert_config_file", "input_file",
                                                                          "output_dir")
    for name in required:
        if not getattr(FLAGS, name):
            fail(f"--{name} is required")
    bert_flags.check_overwrite_protected(
        (FLAGS.init_checkpoint, FLAGS.bert_config_file, FLAGS.vocab_file, FLAGS.input_file))
    objective = FLAGS.objective
    if FLAGS["use_next_sentence_prediction"].present:
        if FLAGS["objective"].present and FLAGS.use_next_sentence_prediction != (objective == "mlm_nsp"):
            fail(f"--use_next_sentence_prediction={FLAGS.use_next_sentence_prediction} contradicts "
                 f"--objective={objective}")
        if not FLAGS.use_next_sentence_prediction and objective == "mlm_nsp":
            objective = "mlm"
    train = bert_flags.unchecked_train_settings()  # checked with the config (PretrainingConfig.check_values)
    try:
        bert_config = BertConfig.from_json_file(FLAGS.bert_config_file) if FLAGS.bert_config_file else None
        config = PretrainingConfig(
            bert_config=bert_config, input_files=(FLAGS.input_file,),
            eval_input_files=(FLAGS.eval_input_file,) if FLAGS.eval_input_file else None,
            output_dir=FLAGS.output_dir, max_seq_length=FLAGS.max_seq_length,
            max_predictions_per_seq=FLAGS.max_predictions_per_seq, do_train=FLAGS.do_train, do_eval=FLAGS.do_eval,
            init_checkpoint=FLAGS.init_checkpoint, train_batch_size=FLAGS.train_batch_size,
            eval_batch_size=FLAGS.eval_batch_size, num_train_steps=FLAGS.num_train_steps,
            num_warmup_steps=FLAGS.num_warmup_steps, max_eval_steps=FLAGS.max_eval_steps, train=train,
            objective=objective, vocab_file=FLAGS.vocab_file, do_lower_case=FLAGS.do_lower_case,
            skip_corrupt_records=FLAGS.skip_corrupt_records, pack_sequences=FLAGS.pack_sequences,
            masking=FLAGS.masking, masked_lm_prob=FLAGS.masked_lm_prob, do_whole_word_mask=FLAGS.do_whole_word_mask,
            max_sequences_per_row=FLAGS.max_sequences_per_row)
        if FLAGS.init_checkpoint:  # the model's fit waits for the checkpoint's config (main)
            config.check_values()
        else:
            config.validate()
    except ConfigError as e:
        fail(str(e))
    return config


def main(_):
    config = pretraining_config()  # the gate: no TensorFlow yet

    bert_setup.setup_process()
    config, strategy = bert_setup.pretraining_settings(config, FLAGS.bert_config_file)
    from bert_tf.runners.pretraining import run_pretraining

    def run():
        results = run_pretraining(config, strategy)  # None without --do_eval
        return {"": results} if results else {}

    bert_setup.run_and_report(run, strategy)


if __name__ == "__main__":
    app.run(main)
