"""What a run shows in TensorBoard, unit by unit (tests/test_tensorboard.py reads it through a real server)."""

import dataclasses

import pytest

from bert_tf.runners import common
from bert_tf.runners.task import FinetuneConfig


@dataclasses.dataclass
class _Task:
    eval_splits: tuple = ("dev",)


@pytest.mark.parametrize("kwargs, expected", [
    (dict(do_train=True, do_eval=True), 6),  # default: one epoch's whole batches (50 // 8)
    (dict(do_train=True, do_eval=True, eval_every_steps=4), 4),
    (dict(do_train=True, do_eval=True, eval_every_steps=0), 0),  # 0: only at the end
    (dict(do_train=True), 0),  # no --do_eval: no evaluation unless asked for
    (dict(do_train=True, eval_every_steps=5), 5),
    (dict(do_eval=True), 0),  # nothing trains
])
def test_eval_interval_defaults_to_each_epoch_with_do_eval(kwargs, expected):
    cfg = FinetuneConfig(output_dir="unused", train_batch_size=8, **kwargs)
    assert common.eval_interval(cfg, _Task(), train_units=50) == expected
    assert common.eval_interval(cfg, _Task(eval_splits=()), train_units=50) == 0
    if expected and "eval_every_steps" not in kwargs:
        assert common.eval_interval(cfg, _Task(), train_units=3) == 1  # fewer examples than a batch


def test_eval_tags_are_the_training_tags():
    assert [common.summary_tag(k) for k in ("eval_accuracy", "eval_loss", "eval_f1", "f1", "exact", "loss")] == \
        ["accuracy", "loss", "f1", "f1", "exact", "loss"]
