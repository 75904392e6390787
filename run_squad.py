"""BERT fine-tuning for extractive question answering: SQuAD v1.1 and v2.0.

The original's flags, defaults and files (predictions.json, nbest_predictions.json,
null_odds.json for v2.0). When --predict_file carries answers (a dev file), the
official evaluation runs on the predictions and writes eval_results.txt; for v2.0
it also reports the best --null_score_diff_threshold.

  python run_squad.py --vocab_file=uncased_L-12_H-768_A-12/vocab.txt \
    --bert_config_file=uncased_L-12_H-768_A-12/bert_config.json \
    --init_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt \
    --do_train --train_file=train-v1.1.json --do_predict --predict_file=dev-v1.1.json \
    --train_batch_size=12 --learning_rate=3e-5 --num_train_epochs=2.0 \
    --max_seq_length=384 --doc_stride=128 --output_dir=/tmp/squad_base
"""

from absl import app, flags

import bert_flags
import bert_setup
from bert_flags import FLAGS, fail

flags.DEFINE_string("train_file", None, "--do_train: the SQuAD JSON to train on (train-v1.1.json, train-v2.0.json).")
flags.DEFINE_string("predict_file", None, "--do_predict: the SQuAD JSON to answer (dev-v1.1.json, ...); when its "
                    "questions carry answers, the predictions are also scored with the official metrics.")
bert_flags.define_doc_stride_flag(128)
flags.DEFINE_integer("max_query_length", 64, "Questions are cut to this many word pieces.")
flags.DEFINE_integer("n_best_size", 20, "Candidates kept per window and start/end side, and answers listed per "
                     "question in nbest_predictions.json.")
flags.DEFINE_integer("max_answer_length", 30, "Longest answer (in word pieces) post-processing accepts.")
flags.DEFINE_bool("verbose_logging", False, "Log the first featurized windows in detail (tokens, maps, positions).")
flags.DEFINE_bool("version_2_with_negative", False, "SQuAD 2.0: questions may be unanswerable (is_impossible); "
                  "the answer is empty when the null answer wins.")
flags.DEFINE_float("null_score_diff_threshold", 0.0, "SQuAD 2.0: answer \"\" when score_null - best_non_null is "
                   "above this; the evaluation of a dev file reports the best value (typically -1 to -5).")
bert_flags.define_finetuning_flags(max_seq_length=384)


def main(_):
    from bert_tf.runners.squad import SquadRunConfig, read_inputs  # no TensorFlow yet

    train = bert_flags.check_finetune_flags()
    cfg = SquadRunConfig(
        output_dir=FLAGS.output_dir, train_file=FLAGS.train_file, predict_file=FLAGS.predict_file,
        version_2_with_negative=FLAGS.version_2_with_negative, do_train=FLAGS.do_train, do_predict=FLAGS.do_predict,
        do_eval=FLAGS.do_eval, do_lower_case=FLAGS.do_lower_case, max_seq_length=FLAGS.max_seq_length,
        doc_stride=FLAGS.doc_stride, max_query_length=FLAGS.max_query_length,
        train_batch_size=FLAGS.train_batch_size, predict_batch_size=FLAGS.predict_batch_size,
        eval_batch_size=FLAGS.predict_batch_size,  # the dev file is evaluated as it is predicted
        num_train_epochs=FLAGS.num_train_epochs, warmup_proportion=FLAGS.warmup_proportion,
        n_best_size=FLAGS.n_best_size, max_answer_length=FLAGS.max_answer_length,
        null_score_diff_threshold=FLAGS.null_score_diff_threshold, eval_every_steps=FLAGS.eval_every_steps,
        early_stopping=FLAGS.early_stopping,
        verbose_logging=FLAGS.verbose_logging)
    # Bad flags and files fail here, before the TensorFlow start-up.
    try:
        inputs = read_inputs(cfg)
    except ValueError as e:  # an InputDataError (bert_tf/errors.py), or a flag's value
        fail(str(e))

    bert_setup.setup_process()
    import dataclasses

    from bert_tf.runners.squad import run

    settings = bert_setup.finetune_settings(train)  # resolves --do_lower_case (None: the checkpoint's casing)
    cfg = dataclasses.replace(cfg, run=settings, do_lower_case=FLAGS.do_lower_case)
    bert_setup.run_and_report(lambda: run(cfg, inputs), settings.strategy, note=f"SQuAD v{cfg.version}",
                              keep_order=True)  # the official evaluation's order


if __name__ == "__main__":
    app.run(main)
