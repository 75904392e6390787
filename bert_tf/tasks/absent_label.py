"""Which label means "found nowhere": the one the window settings that answer "does the text contain X anywhere"
trust (classifier runs with --long_inputs=windows).

clean_negatives trains every window of an input of that label as that label, each_then_calibrate and
clean_negatives shift its logit, and the `any` aggregation gives it the product of the windows' probabilities
(bert_tf.tasks.windows, bert_tf.runners.window_slots). All of them read it as label id 0, so a task's labels are
put in an order whose first entry is the absent label:
- labels listed in id order (--labels, or a built-in task's list): their first entry; an --absent_label that is
  another one is refused (the ids are the list's);
- labels read from train.tsv (--labels not given; sorted): --absent_label goes first, the others stay sorted.
  Where a setting trusts the absent label and none is named (nor recorded by the output_dir's earlier run), the
  run stops with one line that lists the labels: sorting could put the "found" label first (contains_nt before
  none) and train the model backwards.

Plain Python on the label strings and the training file: a run checks this before TensorFlow starts.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from bert_tf.tasks.glue import TaskSpec, infer_labels
from bert_tf.tasks.windows import FIRST_LABEL_TRAINING, window_training_for


def trusting_setting(long_inputs: str, aggregation: str, training: Optional[str]) -> Optional[str]:
    """The flag setting of a run that trusts the absent label, in flag words (e.g. "--window_training=
    clean_negatives (--window_aggregation=max's default)"), None when nothing does."""
    if long_inputs != "windows":
        return None
    used = window_training_for(aggregation, training)
    if used in FIRST_LABEL_TRAINING:
        return f"--window_training={used}" + ("" if training else f" (--window_aggregation={aggregation}'s default)")
    if aggregation == "any":
        return "--window_aggregation=any"
    return None


def order_labels(spec: TaskSpec, data_dir: str, absent_label: Optional[str], trusted_by: Optional[str],
                 recorded: Optional[str] = None) -> TaskSpec:
    """`spec` with its labels in the order a run uses: listed labels as they are; labels read from `data_dir`'s
    training file sorted, with the absent label first when one is named (`absent_label`, else `recorded`: the
    output_dir's bert_tf_info.json). ValueError (one line, in flag words) for an absent label that is not a label,
    that contradicts listed labels, or that is needed (`trusted_by`: trusting_setting's text) and not named.
    Regression specs come back unchanged (an --absent_label with one is refused)."""
    if spec.is_regression:
        if absent_label is not None:
            raise ValueError("--absent_label needs labels; this task is a regression")
        return spec
    if spec.labels:  # listed in id order: the first is the absent label
        if absent_label is not None and absent_label != spec.labels[0]:
            raise ValueError(f"--absent_label={absent_label} but the labels are listed in id order "
                             f"({', '.join(spec.labels)}), the first meaning 'found nowhere': list {absent_label} "
                             "first in --labels, or drop --absent_label")
        return spec
    labels = infer_labels(spec, data_dir).labels
    named = absent_label if absent_label is not None else recorded
    if named is None:
        if trusted_by:
            raise ValueError(f"{trusted_by} trusts one label to mean 'found nowhere', and the labels read from "
                             f"the training file are {', '.join(labels)}: name it with --absent_label=<label> (or "
                             "give --labels in id order, that label first)")
        return dataclasses.replace(spec, labels=labels)
    if named not in labels:
        source = "--absent_label" if absent_label is not None else "the output_dir's recorded absent_label"
        raise ValueError(f"{source} {named!r} is not one of the labels of the training file "
                         f"({', '.join(labels)})")
    return dataclasses.replace(spec, labels=(named, *(label for label in labels if label != named)))


__all__ = ["order_labels", "trusting_setting"]
