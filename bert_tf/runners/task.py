"""What a fine-tuning task is to the one run (bert_tf.runners.common.run_finetuning), and the run's own settings.

Plain Python (no TensorFlow), so a script can check its flags and files before the TensorFlow start-up.
A new task is one adapter file with a `FinetuneTask` and a config that extends `FinetuneConfig`,
plus a thin script (docs/design.md).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from bert_tf.configs import TaskRecord

if TYPE_CHECKING:
    from bert_tf.runners.settings import RunSettings


@dataclasses.dataclass(frozen=True, kw_only=True)
class FinetuneConfig:
    """What every fine-tuning run is asked (the original run_classifier.py's flags); a task's
    config extends it with its own fields. run: how to train (None only for plain-Python checks)."""

    output_dir: str
    run: Optional["RunSettings"] = None
    max_seq_length: int = 128
    do_lower_case: bool = True
    do_train: bool = False
    do_eval: bool = False
    do_predict: bool = False
    train_batch_size: int = 32
    eval_batch_size: int = 8
    predict_batch_size: int = 8
    num_train_epochs: float = 3.0
    warmup_proportion: float = 0.1
    # Evaluate every N steps of training and keep the best model in output_dir/best. None: with
    # do_train and do_eval, at the end of each epoch (TensorBoard's eval run is a curve); 0: only at the end.
    eval_every_steps: Optional[int] = None
    # > 0: stop training once the best model's metric (the task's primary_metric) has not improved for this
    # many evaluations in a row; 0: train every step.
    early_stopping: int = 0


@dataclasses.dataclass
class Featurized:
    """One split read and featurized: the model's input arrays (first axis N) and what decoding needs.

    count: what the number of training steps is computed from (examples, as the original; windows where
    an example is cut into several).
    window_example: int [M] when a row of `arrays` is one window of an example: the example of each row.
    """

    examples: List[Any]
    arrays: Dict[str, Any]
    count: int
    features: Optional[List[Any]] = None
    packed: Optional[Any] = None  # bert_tf.data.packing.PackedExamples of `arrays` (--pack_sequences)
    window_example: Optional[Any] = None


class FinetuneTask:
    """A task's own logic; the run (check, featurize, train, evaluate, predict, write) is the skeleton's.

    task_type       a bert_tf.model_dir.TASK_MODELS key: the model built on the encoder
    eval_splits     the splits with labels that evaluation scores (eval_results[_<split>].txt)
    predict_splits  the splits --do_predict runs on
    primary_metric  the key (of eval_splits[0]'s results) that picks the best model; higher is better
    sequence_outputs  the model's outputs are per token ([N, S, ...])
    ordered_results   eval_results keep the score's key order (else sorted, as the original)
    not_packable    why several examples cannot share a row here ("" when they can: --pack_sequences,
                    bert_tf.data.packing.pack_examples)
    pack_pad_values   per-token arrays' values where a packed row has no token (default 0)
    """

    task_type: str
    eval_splits: Sequence[str] = ("dev",)
    predict_splits: Sequence[str] = ("test",)
    primary_metric: str = "eval_accuracy"
    sequence_outputs: bool = False
    ordered_results: bool = False
    not_packable: str = ""
    pack_pad_values: Dict[str, int] = {}

    def setup(self, pretrained) -> TaskRecord:
        """Before any data is featurized: the task's record (labels, choices, settings), which builds
        the model, must match a run being resumed, and goes to bert_tf_info.json."""
        raise NotImplementedError

    def featurize(self, split: str, tokenizer) -> Featurized:
        raise NotImplementedError

    def start_head(self, model, train: Featurized) -> None:
        """A freshly built model's head before the starting weights load (they replace it where the checkpoint
        holds a head, as a resumed run's checkpoint does): nothing by default."""

    def loss(self, model, batch, training):
        """(scalar loss, {name: (value, weight)}) of one batch: the Trainer's loss_fn."""
        raise NotImplementedError

    def score(self, split: str, data: Featurized, outputs) -> Tuple[Optional[Dict[str, float]], Any]:
        """(metrics or None when the split has no labels, the decoded predictions) of the model's outputs."""
        raise NotImplementedError

    def write(self, output_dir: str, split: str, data: Featurized, decoded) -> None:
        """The task's prediction files for one split (nothing by default)."""

    def summary(self) -> Dict[str, Any]:
        """Extra lines for the run summary."""
        return {}
