"""BERT fine-tuning for sentence(-pair) classification and regression.

Every GLUE task (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI, AX), XNLI,
and your own TSV/CSV (`--task_name=user` with the column flags). Writes the
original's eval_results.txt and test_results.tsv, and GLUE submission files.

  python run_classifier.py --task_name=MRPC --data_dir=glue/MRPC \
    --init_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt \
    --bert_config_file=uncased_L-12_H-768_A-12/bert_config.json \
    --vocab_file=uncased_L-12_H-768_A-12/vocab.txt \
    --do_train --do_eval --output_dir=/tmp/mrpc

Longer texts than --max_seq_length: --long_inputs=windows --doc_stride=64 --window_aggregation=mean.
"""

from absl import app, flags

import bert_flags
import bert_setup
from bert_flags import FLAGS, fail

flags.DEFINE_string("data_dir", None, "The folder with the task's .tsv (or .csv) files.")
flags.DEFINE_string("task_name", None, "GLUE task (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI, AX), "
                    "XNLI, or 'user' for your own files.")
flags.DEFINE_string("xnli_language", "zh", "XNLI: the language to train and evaluate on.")
flags.DEFINE_enum("file_format", "tsv", ["tsv", "csv"], "--task_name=user: train/dev/test.<file_format> "
                  "with a header row.")
flags.DEFINE_string("text_a_column", "sentence", "--task_name=user: the header of the first text column.")
flags.DEFINE_string("text_b_column", None, "--task_name=user: the header of the second text column (pairs).")
flags.DEFINE_string("label_column", "label", "--task_name=user: the header of the label column.")
flags.DEFINE_string("index_column", None, "--task_name=user: the header of the id column of the test file.")
flags.DEFINE_list("labels", None, "--task_name=user: the label set in id order (default: read from train).")
flags.DEFINE_string("absent_label", None, "--long_inputs=windows: the label meaning 'found nowhere', which "
                    "clean_negatives (max's default), each_then_calibrate (any's default) and --window_aggregation=any "
                    "trust; it gets label id 0. Needed with those when --labels is not given (labels read from train "
                    "are sorted); with --labels it is their first. Recorded in bert_tf_info.json for later runs.")
flags.DEFINE_bool("regression", False, "--task_name=user: the label is a number (Pearson/Spearman).")
flags.DEFINE_enum("pooling", None, ["cls", "mean"], "What the classifier reads: cls, the pooler at [CLS] (BERT's); "
                  "mean, the last layer averaged over the input's tokens (what sentence-transformers checkpoints "
                  "such as all-MiniLM-L6-v2 are trained for). Default: the checkpoint's own (a sentence-transformers "
                  "folder's pooling config), else cls; a rerun or evaluation keeps the output_dir's.")
bert_flags.define_long_input_flags()
bert_flags.define_finetuning_flags()


def ordered_labels(task):
    """The task with its labels in the order the run uses, the absent label first (bert_tf.tasks.absent_label);
    a ValueError (one line) where a trusted absent label is not named. Reads only train's labels: no TensorFlow."""
    from bert_tf.configs import read_run_info
    from bert_tf.tasks.absent_label import order_labels, trusting_setting

    trusted_by = trusting_setting(FLAGS.long_inputs, FLAGS.window_aggregation, FLAGS.window_training)
    if not trusted_by and FLAGS.absent_label is None:
        return task
    recorded = read_run_info(FLAGS.output_dir).get("absent_label") if FLAGS.output_dir else None
    return order_labels(task, FLAGS.data_dir, FLAGS.absent_label, trusted_by, recorded)


def main(_):
    from bert_tf.tasks import glue  # (no TensorFlow: the gate)

    if not FLAGS.task_name or not FLAGS.data_dir:
        fail("--task_name and --data_dir are required")
    bert_flags.check_long_input_flags()
    try:
        if FLAGS.task_name.lower() == "user":
            task = glue.user_task(FLAGS.text_a_column, FLAGS.label_column, FLAGS.text_b_column,
                                  labels=FLAGS.labels, regression=FLAGS.regression, index=FLAGS.index_column,
                                  file_format=FLAGS.file_format)
        else:
            task = glue.get_task(FLAGS.task_name, xnli_language=FLAGS.xnli_language)
        task = ordered_labels(task)  # before TensorFlow starts: the absent label a run trusts is named
    except ValueError as e:  # an InputDataError (bert_tf/errors.py), or a flag's value
        fail(str(e))
    train = bert_flags.check_finetune_flags()

    bert_setup.setup_process()
    from bert_tf.runners.classifier import ClassifierRunConfig, run

    settings = bert_setup.finetune_settings(train)
    cfg = ClassifierRunConfig(
        task=task, data_dir=FLAGS.data_dir, long_inputs=FLAGS.long_inputs, doc_stride=FLAGS.doc_stride,
        window_aggregation=FLAGS.window_aggregation, window_training=FLAGS.window_training, pooling=FLAGS.pooling,
        absent_label=FLAGS.absent_label,
        **bert_flags.finetune_config_kwargs(settings))
    bert_setup.run_and_report(lambda: run(cfg), settings.strategy)


if __name__ == "__main__":
    app.run(main)
