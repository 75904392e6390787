"""BERT fine-tuning for SWAG multiple choice (four endings, softmax over the choices).

data_dir holds the SWAG release's train.csv, val.csv and test.csv. Writes
eval_results.txt (eval_accuracy, eval_loss, global_step) and test_results.csv
(id, the probability of each ending, the predicted ending). The paper's setting:
learning rate 2e-5, batch 16, 3 epochs.

  python run_swag.py --data_dir=swagaf/data \
    --init_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt \
    --bert_config_file=uncased_L-12_H-768_A-12/bert_config.json \
    --vocab_file=uncased_L-12_H-768_A-12/vocab.txt \
    --do_train --do_eval --output_dir=/tmp/swag
"""

from absl import app, flags

import bert_flags
import bert_setup
from bert_flags import FLAGS, fail

flags.DEFINE_string("data_dir", None, "The folder with the SWAG train.csv, val.csv and test.csv.")
bert_flags.define_finetuning_flags(max_seq_length=128, learning_rate=2e-5, train_batch_size=16, num_train_epochs=3.0)


def main(_):
    if not FLAGS.data_dir:
        fail("--data_dir is required")
    train = bert_flags.check_finetune_flags()

    bert_setup.setup_process()
    from bert_tf.runners.swag import SwagRunConfig, run

    settings = bert_setup.finetune_settings(train)
    cfg = SwagRunConfig(
        data_dir=FLAGS.data_dir, **bert_flags.finetune_config_kwargs(settings))
    bert_setup.run_and_report(lambda: run(cfg), settings.strategy)


if __name__ == "__main__":
    app.run(main)
