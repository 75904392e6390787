"""--early_stopping's refusals where training does not evaluate (plain checks, no training; the run itself,
its stop, the rerun and best/'s export: tests/test_run_classifier.py)."""

import pytest

from bert_tf.errors import ConfigError
from bert_tf.runners.common import best_model_summary, check_early_stopping
from bert_tf.runners.task import FinetuneConfig, FinetuneTask


class _Task(FinetuneTask):
    def __init__(self, eval_splits=("dev",)):
        self.eval_splits = eval_splits


@pytest.mark.parametrize("kw, message", [
    (dict(do_train=False, do_eval=True), "--early_stopping stops training: it needs --do_train"),
    (dict(do_train=True), "--early_stopping needs evaluations during training: add --do_eval (one per epoch) or "
                          "--eval_every_steps=N"),
    (dict(do_train=True, do_eval=True, eval_every_steps=0), "--early_stopping needs evaluations during training: "
                                                            "add --do_eval (one per epoch) or --eval_every_steps=N"),
])
def test_early_stopping_without_evaluations_during_training_is_one_line(kw, message):
    with pytest.raises(ConfigError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        check_early_stopping(FinetuneConfig(output_dir="out", early_stopping=2, **kw), _Task())


def test_early_stopping_with_evaluations_is_accepted_and_named_in_the_summary():
    check_early_stopping(FinetuneConfig(output_dir="out", do_train=True, do_eval=True, early_stopping=3), _Task())
    check_early_stopping(FinetuneConfig(output_dir="out", do_train=True, eval_every_steps=5, early_stopping=1), _Task())
    check_early_stopping(FinetuneConfig(output_dir="out", do_train=True), _Task(()))  # off: nothing to check
    with pytest.raises(ConfigError, match="^--early_stopping needs a dev set to evaluate during training; "
                                            "this run has none$"):
        check_early_stopping(FinetuneConfig(output_dir="out", do_train=True, do_eval=True, early_stopping=1),
                             _Task(()))
    task = _Task()
    task.primary_metric = "eval_f1"
    assert best_model_summary(task, 100, 3) == ("best/ keeps the highest eval_f1 on dev, evaluated every 100 steps; "
                                                "early stopping after 3 evaluation(s) without a higher one")
    assert best_model_summary(task, 100, 0) == "best/ keeps the highest eval_f1 on dev, evaluated every 100 steps"
