"""SQuAD v1.1 / v2.0 fine-tuning: train on a train file, predict and evaluate on a dev file.

The library side of run_squad.py. Two calls:
  inputs = read_inputs(cfg)   # plain Python: checks the options and reads the JSON files
  results = run(cfg, inputs)  # trains / predicts / evaluates (TensorFlow)
`read_inputs` needs no TensorFlow, so a bad file or flag fails in a second instead of
after the TensorFlow start-up; `run(cfg)` calls it itself when not given inputs.

Files written into output_dir, as the original: `predictions.json` {id: text},
`nbest_predictions.json` {id: [{text, probability, start_logit, end_logit}]} and,
for v2.0, `null_odds.json` {id: score_null - best_non_null}. When the predict file
carries answers, the official evaluation runs on the predictions and its numbers go
to `eval_results.txt` (`key = value`, the official scripts' keys) and TensorBoard
(`output_dir/eval`). For v2.0 the log names the `null_score_diff_threshold` to predict with
next time: one that gives the evaluation's best F1 when passed back (the official
`best_f1_thresh` is kept in eval_results.txt as the official script reports it, but it
is not always that threshold: squad_metrics.best_null_threshold). `eval_every_steps` evaluates
during training and keeps the best model (v1.1 by f1, v2.0 by best_f1) in `output_dir/best`.

Loss: the mean of the start and end cross-entropies (docs/reference.md §3). Unlike the
original, padding positions take no part in the softmax: with dynamic padding a
batch's padding length varies, and the loss must not depend on it (post-processing
never picks a padding position anyway).
Dimensions: N features, S max_seq_length.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Dict, List, Optional, Tuple

from bert_tf.configs import TaskRecord
from bert_tf.errors import InputDataError
from bert_tf.runners.task import Featurized, FinetuneConfig, FinetuneTask
from bert_tf.tasks import squad, squad_metrics

logger = logging.getLogger("bert_tf.squad")

TASK_NAME = "squad"
EVAL_SPLIT = "dev"
# Added to the logits of padding positions before the softmax of the loss (as the attention mask).
PADDING_LOGIT = -10000.0
# The original logged this many featurized examples in detail (here with --verbose_logging).
NUM_LOGGED_FEATURES = 20


@dataclasses.dataclass(frozen=True, kw_only=True)
class SquadRunConfig(FinetuneConfig):
    """What run_squad.py was asked to do; defaults are the original's flags. do_eval: predict on
    predict_file and require answers to evaluate against. run may be None for `read_inputs`."""

    train_file: Optional[str] = None
    predict_file: Optional[str] = None
    version_2_with_negative: bool = False
    max_seq_length: int = squad.DEFAULT_MAX_SEQ_LENGTH
    doc_stride: int = squad.DEFAULT_DOC_STRIDE
    max_query_length: int = squad.DEFAULT_MAX_QUERY_LENGTH
    n_best_size: int = squad.DEFAULT_N_BEST_SIZE
    max_answer_length: int = squad.DEFAULT_MAX_ANSWER_LENGTH
    null_score_diff_threshold: float = squad.DEFAULT_NULL_SCORE_DIFF_THRESHOLD
    verbose_logging: bool = False

    @property
    def version(self) -> str:
        return "2.0" if self.version_2_with_negative else "1.1"


@dataclasses.dataclass(frozen=True)
class SquadInputs:
    """The files read and checked. dev_data: the predict file's "data" list when every question
    carries answers (so the official evaluation can run), else None."""

    train_examples: Optional[List[squad.SquadExample]]
    predict_examples: Optional[List[squad.SquadExample]]
    dev_data: Optional[list]


# ----------------------------------------------------------------- options and files (no TensorFlow)
def check_options(cfg: SquadRunConfig) -> None:
    """Raises ValueError naming the flag for options that cannot work."""
    if not (cfg.do_train or cfg.do_predict or cfg.do_eval):
        raise ValueError("at least one of --do_train, --do_predict or --do_eval must be set")
    if cfg.do_train and not cfg.train_file:
        raise ValueError("--do_train needs --train_file")
    if (cfg.do_predict or cfg.do_eval) and not cfg.predict_file:
        raise ValueError("--do_predict and --do_eval need --predict_file")
    if cfg.do_train and cfg.eval_every_steps and not cfg.predict_file:
        raise ValueError("--eval_every_steps needs --predict_file (a dev file with answers)")
    positive = dict(max_seq_length=cfg.max_seq_length, doc_stride=cfg.doc_stride,
                    max_query_length=cfg.max_query_length, n_best_size=cfg.n_best_size,
                    max_answer_length=cfg.max_answer_length, train_batch_size=cfg.train_batch_size,
                    predict_batch_size=cfg.predict_batch_size)
    for name, value in positive.items():
        if value <= 0:
            raise ValueError(f"--{name} must be positive, got {value}")
    if cfg.eval_every_steps is not None and cfg.eval_every_steps < 0:
        raise ValueError(f"--eval_every_steps must be >= 0, got {cfg.eval_every_steps}")


def _questions(data):
    """The question objects of a SQuAD "data" list; skips what is malformed (read_squad_examples reports it)."""
    for article in data if isinstance(data, list) else []:
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        for paragraph in paragraphs if isinstance(paragraphs, list) else []:
            qas = paragraph.get("qas") if isinstance(paragraph, dict) else None
            yield from (qa for qa in (qas if isinstance(qas, list) else []) if isinstance(qa, dict))


def _check_version(path: str, data: list, version_2_with_negative: bool) -> None:
    """A v2.0 file (unanswerable questions) read as v1.1 would train on / score against nothing."""
    if version_2_with_negative:
        return
    for qa in _questions(data):
        if qa.get("is_impossible") is True:
            raise InputDataError(f"{path}: question {qa.get('id')} is unanswerable (is_impossible: true), so this is "
                                "a SQuAD v2.0 file; pass --version_2_with_negative")


def _first_unscorable(data: list, version_2_with_negative: bool) -> Optional[str]:
    """The id of the first question the official evaluation cannot score (no reference answers), or None."""
    for qa in _questions(data):
        answers = qa.get("answers")
        if not isinstance(answers, list) or not all(isinstance(a, dict) and isinstance(a.get("text"), str)
                                                    for a in answers):
            return qa["id"]
        if not answers and not (version_2_with_negative and qa.get("is_impossible") is True):
            return qa["id"]
    return None


def _read(path: str, is_training: bool, version_2_with_negative: bool):
    """(examples, the JSON's "data" list); InputDataError for unreadable, malformed or mismatched files."""
    data = squad_metrics.load_json(path, "a SQuAD dataset")
    _check_version(path, data.get("data") if isinstance(data, dict) else None, version_2_with_negative)
    examples = squad.read_squad_examples(path, is_training, version_2_with_negative)
    if not examples:
        raise InputDataError(f"{path}: no questions")
    return examples, data["data"]


def read_inputs(cfg: SquadRunConfig) -> SquadInputs:
    """Checks the options and reads the train and predict files (plain Python, no TensorFlow).

    Raises ValueError / InputDataError with a one-line message naming the flag or the file.
    """
    check_options(cfg)
    train_examples = predict_examples = dev_data = None
    if cfg.do_train:
        train_examples, _ = _read(cfg.train_file, True, cfg.version_2_with_negative)
    if cfg.do_predict or cfg.do_eval or (cfg.do_train and cfg.eval_every_steps):
        predict_examples, data = _read(cfg.predict_file, False, cfg.version_2_with_negative)
        missing = _first_unscorable(data, cfg.version_2_with_negative)
        if missing is None:
            dev_data = data
        elif cfg.do_eval or (cfg.do_train and cfg.eval_every_steps):
            raise InputDataError(f"{cfg.predict_file}: question {missing} has no reference answers, so it cannot "
                                "be evaluated (--do_eval/--eval_every_steps need a dev file with answers)")
    return SquadInputs(train_examples, predict_examples, dev_data)


# ----------------------------------------------------------------- evaluation (no TensorFlow)
def evaluate_predictions(dev_data: list, predictions, null_odds, cfg: SquadRunConfig) -> Dict[str, float]:
    """The official metrics of `predictions` (v1.1: exact_match, f1; v2.0: the v2.0 script's dict
    with `null_odds` as the no-answer probabilities, as `--na-prob-file null_odds.json`).

    v2.0's no-answer threshold is the script's default 1.0, or the post-processing's
    null_score_diff_threshold when higher, so it never overrules the predictions made.
    """
    if not cfg.version_2_with_negative:
        return dict(squad_metrics.evaluate_v1(dev_data, predictions))
    na_prob_thresh = max(squad_metrics.DEFAULT_NA_PROB_THRESH, cfg.null_score_diff_threshold)
    return dict(squad_metrics.evaluate_v2(dev_data, predictions, null_odds, na_prob_thresh))


def _log_best_threshold(m: Dict[str, float], used: float, best: Tuple[float, float]) -> None:
    """Reports the v2.0 evaluation's best null threshold and the value to predict with.

    `m` holds the official numbers (best_f1 at best_f1_thresh, as the official script reports them);
    `best` = (F1, threshold) of squad_metrics.best_null_threshold: the threshold that gives that F1
    when passed back as --null_score_diff_threshold. The sweep answers questions in order of rising
    null odds with their *predicted* text, and those above the threshold used were predicted "": it can
    only find thresholds at or below the one used (docs/reference.md §7: typically -1..-5, so predict
    with the default 0.0 first).
    """
    f1, threshold = best
    if f1 > m["f1"]:
        logger.info("best null threshold: best_f1 %.4f (official best_f1_thresh %.4f; best_exact %.4f) vs f1 %.4f "
                    "at %g; predict with --null_score_diff_threshold=%s for f1 %.4f", m["best_f1"],
                    m["best_f1_thresh"], m["best_exact"], m["f1"], used, threshold, f1)
    else:
        logger.info("best null threshold: none better than the one used (%g, f1 %.4f); a higher "
                    "--null_score_diff_threshold lets the evaluation try answering more questions", used, m["f1"])


# ----------------------------------------------------------------- TensorFlow side
def span_loss(model, batch, training):
    """Mean over the batch of (start cross-entropy + end cross-entropy) / 2; start/end accuracy.

    batch: input_ids, input_mask, segment_ids int32 [B, S]; start_positions, end_positions int32 [B]
    (0 = [CLS]: no answer in this window).
    """
    import tensorflow as tf

    outputs = model(batch, training=training)
    padding = (1.0 - tf.cast(batch["input_mask"], tf.float32)) * PADDING_LOGIT  # [B, S]
    weight = tf.cast(tf.shape(padding)[0], tf.float32)
    losses, metrics = [], {}
    for side in ("start", "end"):
        logits = tf.cast(outputs[f"{side}_logits"], tf.float32) + padding  # [B, S]
        positions = tf.cast(batch[f"{side}_positions"], tf.int32)  # [B]
        losses.append(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=positions, logits=logits))
        correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), positions), tf.float32)
        metrics[f"{side}_accuracy"] = (tf.reduce_mean(correct), weight)
    loss = tf.reduce_mean((losses[0] + losses[1]) / 2.0)
    return loss, metrics


class SquadTask(FinetuneTask):
    """Start and end logits [N, S] per window; post-processing picks each question's best span.

    The predict file is both the split evaluated ("dev", when its questions carry answers) and
    the one predicted: one pass of the model writes the predictions and scores them.
    """

    task_type = "span"
    not_packable = "SQuAD's document windows fill their rows already"
    predict_splits = (EVAL_SPLIT,)
    sequence_outputs = True
    ordered_results = True  # eval_results.txt in the official scripts' key order
    loss = staticmethod(span_loss)

    def __init__(self, cfg: SquadRunConfig, inputs: SquadInputs):
        self.cfg, self.inputs = cfg, inputs
        self.metrics = None  # of the latest score
        self.best_threshold = None  # v2.0: (F1, null threshold that gives it) of the latest score
        self.eval_splits = (EVAL_SPLIT,) if inputs.dev_data is not None else ()
        self.primary_metric = "best_f1" if cfg.version_2_with_negative else "f1"

    def setup(self, pretrained):
        cfg = self.cfg
        return TaskRecord(self.task_type, task=TASK_NAME, version_2_with_negative=cfg.version_2_with_negative,
                          doc_stride=cfg.doc_stride, max_query_length=cfg.max_query_length)

    def featurize(self, split, tokenizer):
        cfg = self.cfg
        is_training = split == "train"
        examples = self.inputs.train_examples if is_training else self.inputs.predict_examples
        features = squad.convert_examples_to_features(
            examples, tokenizer, cfg.max_seq_length, cfg.doc_stride, cfg.max_query_length,
            is_training=is_training, pad_to_max_length=False)
        arrays = squad.features_to_arrays(features, cfg.max_seq_length)
        if is_training:
            del arrays["unique_ids"]
        logger.info("%s: %d questions -> %d features (max_seq_length %d, doc_stride %d)",
                    cfg.train_file if is_training else cfg.predict_file, len(examples), len(features),
                    cfg.max_seq_length, cfg.doc_stride)
        if cfg.verbose_logging:
            for f in features[:NUM_LOGGED_FEATURES]:
                logger.info("feature %d (question %s, span %d): tokens %s; token_to_orig_map %s; "
                            "token_is_max_context %s; start/end %s/%s", f.unique_id, examples[f.example_index].qas_id,
                            f.doc_span_index, " ".join(f.tokens), f.token_to_orig_map,
                            {k: int(v) for k, v in f.token_is_max_context.items()}, f.start_position, f.end_position)
        # As the original: steps from the number of questions, not of (more numerous) features.
        return Featurized(examples, arrays, len(examples), features)

    def score(self, split, data, outputs):
        cfg = self.cfg
        results = [squad.RawResult(int(uid), start, end) for uid, start, end in
                   zip(data.arrays["unique_ids"], outputs["start_logits"], outputs["end_logits"], strict=True)]
        decoded = squad.compute_predictions(
            data.examples, data.features, results, cfg.n_best_size, cfg.max_answer_length,
            cfg.do_lower_case, cfg.version_2_with_negative, cfg.null_score_diff_threshold)
        self.metrics = None if self.inputs.dev_data is None else \
            evaluate_predictions(self.inputs.dev_data, decoded[0], decoded[2], cfg)
        if self.metrics is not None and cfg.version_2_with_negative:
            self.best_threshold = squad_metrics.best_null_threshold(self.inputs.dev_data, decoded[0], decoded[2])
        return self.metrics, decoded

    def write(self, output_dir, split, data, decoded):
        import numpy as np

        cfg = self.cfg
        predictions, nbest, null_odds = decoded
        written = squad.write_prediction_files(output_dir, predictions, nbest, null_odds, cfg.version_2_with_negative)
        logger.info("wrote %s in %s (%d questions)", ", ".join(written), output_dir, len(predictions))
        if self.inputs.dev_data is None:
            logger.info("%s has no reference answers: predictions only, no evaluation", cfg.predict_file)
        if cfg.version_2_with_negative:
            if self.metrics is not None:
                _log_best_threshold(self.metrics, cfg.null_score_diff_threshold, self.best_threshold)
            odds = np.array(list(null_odds.values()), np.float64)
            logger.info("null odds (score_null - best_non_null): min %.3f median %.3f max %.3f",
                        odds.min(), float(np.median(odds)), odds.max())

    def summary(self):
        return {"task": f"SQuAD v{self.cfg.version}"}


def run(cfg: SquadRunConfig, inputs: Optional[SquadInputs] = None) -> Dict[str, Dict[str, float]]:
    """Trains / predicts / evaluates as asked; returns {"dev": official metrics} when evaluated."""
    from bert_tf.runners.common import run_finetuning  # lazy: read_inputs checks files before TensorFlow loads

    inputs = inputs if inputs is not None else read_inputs(cfg)
    return run_finetuning(SquadTask(cfg, inputs), cfg)


__all__ = ["SquadInputs", "SquadRunConfig", "SquadTask", "check_options", "evaluate_predictions", "read_inputs",
           "run", "span_loss"]
