"""BERT fine-tuning for named-entity recognition on CoNLL-2003-format files.

data_dir holds train.txt, valid.txt (or dev.txt) and test.txt: `word POS chunk NER` per
line (only the first and last columns are used), blank lines between sentences,
-DOCSTART- lines between documents. The first word piece of each word is labelled, as
in the BERT paper. Writes eval_results.txt (entity-level precision, recall and F1 with
conlleval's semantics) and the dev/test files with the predicted tag appended
(eval_predictions.txt, test_predictions.txt: `word POS chunk gold pred`, what conlleval reads).

  python run_ner.py --data_dir=conll2003 \
    --init_checkpoint=cased_L-12_H-768_A-12/bert_model.ckpt \
    --bert_config_file=cased_L-12_H-768_A-12/bert_config.json \
    --vocab_file=cased_L-12_H-768_A-12/vocab.txt --do_lower_case=False \
    --do_train --do_eval --do_predict --output_dir=/tmp/ner
"""

from absl import app, flags

import bert_flags
import bert_setup
from bert_flags import FLAGS, fail

flags.DEFINE_string("data_dir", None, "The folder with train.txt, valid.txt (or dev.txt) and test.txt.")
flags.DEFINE_list("labels", None, "The tag set in id order, or 'conll2003' for the CoNLL-2003 tags (default: the "
                  "trained model's in --output_dir, else the tags of train.txt, widened to all nine CoNLL-2003 "
                  "tags when it only uses those).")
flags.DEFINE_bool("feature_based", False, "Do not fine-tune BERT: train a 2-layer BiLSTM tagger on its frozen "
                  "features (the paper's feature-based approach, Table 7).")
flags.DEFINE_string("feature_layers", "concat_last:4", "--feature_based: how the encoder layers are combined: "
                    "layer:<index>, sum_last:<k>, concat_last:<k> (the paper's best) or scalar_mix (learned).")
bert_flags.define_doc_stride_flag(0, note="0 (the default here): windows of whole words one after another, "
                                  "without overlap. > 0: each word is tagged in the window that gives it the most "
                                  "context (SQuAD's rule).")
bert_flags.define_finetuning_flags(max_seq_length=128, learning_rate=5e-5, train_batch_size=32, num_train_epochs=3.0)


def main(_):
    from bert_tf.tasks.conll import CONLL2003_LABELS  # (no TensorFlow: the gate)

    if not FLAGS.data_dir:
        fail("--data_dir is required")
    labels = FLAGS.labels
    if labels and [label.lower() for label in labels] == ["conll2003"]:
        labels = CONLL2003_LABELS
    train = bert_flags.check_finetune_flags()

    bert_setup.setup_process()
    from bert_tf.runners.ner import NerRunConfig, run

    settings = bert_setup.finetune_settings(train)
    cfg = NerRunConfig(
        data_dir=FLAGS.data_dir, labels=tuple(labels) if labels else None, feature_based=FLAGS.feature_based,
        feature_layers=FLAGS.feature_layers, doc_stride=FLAGS.doc_stride, **bert_flags.finetune_config_kwargs(settings))
    bert_setup.run_and_report(lambda: run(cfg), settings.strategy)


if __name__ == "__main__":
    app.run(main)
