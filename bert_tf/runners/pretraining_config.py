"""What a pretraining run is asked to do (`PretrainingConfig`): plain values, checked without TensorFlow.

run_pretraining.py builds and checks it before TensorFlow loads (bert_flags.pretraining_config);
bert_tf.runners.pretraining.run_pretraining trusts a checked config. What needs the data (the
records' kind, their largest token id) is checked there, once the records are read.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from bert_tf.configs import BertConfig
from bert_tf.data import schema
from bert_tf.errors import ConfigError, InputDataError
from bert_tf.tokenization import check_vocab_fits
from bert_tf.training.settings import TrainSettings

# Pretraining objectives: name -> (what it is, next-sentence head, causal encoder).
OBJECTIVES = {
    "mlm_nsp": ("masked LM + next sentence", True, False),
    "mlm": ("masked LM only (No NSP)", False, False),
    "ltr": ("left-to-right LM, causal attention (LTR & No NSP)", False, True),
}
DEFAULT_OBJECTIVE = "mlm_nsp"
# Defaults of the original run_pretraining.py flags.
DEFAULT_MAX_EVAL_STEPS = 100
# Masks of records without them (create_pretraining_data.py --masking=dynamic): "auto" takes the
# records' kind, the others require it. The masking rate is the original's default.
MASKINGS = ("auto", schema.STATIC, schema.DYNAMIC)
DEFAULT_MASKED_LM_PROB = 0.15


PretrainingError = ConfigError  # the old name, kept importable (bert_tf/errors.py: what can go wrong)


@dataclasses.dataclass(frozen=True)
class PretrainingConfig:
    """Everything run_pretraining.py's flags say; batch sizes are global; `train`: how to train,
    as fine-tuning (bert_flags.train_settings builds both from the same flags)."""

    bert_config: BertConfig
    input_files: Sequence[str]
    output_dir: str
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    do_train: bool = False
    do_eval: bool = False
    eval_input_files: Optional[Sequence[str]] = None  # None: evaluate on input_files, as the original
    init_checkpoint: Optional[str] = None
    train_batch_size: int = 32
    eval_batch_size: int = 8
    num_train_steps: int = 100000
    num_warmup_steps: int = 10000
    max_eval_steps: int = DEFAULT_MAX_EVAL_STEPS
    train: TrainSettings = TrainSettings()
    use_next_sentence_prediction: bool = True
    # One of OBJECTIVES. "mlm_nsp" with use_next_sentence_prediction=False means "mlm" (the older spelling);
    # "mlm" and "ltr" turn use_next_sentence_prediction off, so the two fields always agree.
    objective: str = DEFAULT_OBJECTIVE
    vocab_file: Optional[str] = None
    do_lower_case: Optional[bool] = None
    skip_corrupt_records: bool = False  # read on past corrupt TFRecord data (counted and logged) instead of failing
    # Several instances per row of max_seq_length (bert_tf.data.packing): static shapes with little
    # padding, for XLA on TPU/GPU. Batch sizes then count packed rows.
    pack_sequences: bool = False
    max_sequences_per_row: Optional[int] = None  # None: bert_tf.data.packing.MAX_SEQUENCES_PER_ROW
    # Records without masks get them drawn while reading (bert_tf.data.masking), with these settings;
    # `masking` (one of MASKINGS) says which kind of records is expected.
    masking: str = "auto"
    masked_lm_prob: float = DEFAULT_MASKED_LM_PROB
    do_whole_word_mask: bool = False

    def __post_init__(self):
        if self.objective == "mlm_nsp" and not self.use_next_sentence_prediction:
            object.__setattr__(self, "objective", "mlm")
        if self.objective in OBJECTIVES:
            object.__setattr__(self, "use_next_sentence_prediction", OBJECTIVES[self.objective][1])

    @property
    def causal(self) -> bool:
        return OBJECTIVES[self.objective][2]

    def validate(self) -> None:
        """One-line ConfigErrors for a config no run can use: check_values(), then the model's fit."""
        self.check_values()
        if self.vocab_file:
            try:
                check_vocab_fits(self.vocab_file, self.bert_config.vocab_size, self.init_checkpoint)
            except InputDataError as e:
                raise ConfigError(str(e)) from None
        if self.max_seq_length > self.bert_config.max_position_embeddings:
            raise ConfigError(
                f"max_seq_length {self.max_seq_length} is longer than the model's max_position_embeddings "
                f"{self.bert_config.max_position_embeddings}"
            )

    def check_values(self) -> None:
        """The checks that need no model config (the gate's, before a --init_checkpoint is read)."""
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"unknown objective {self.objective!r}; expected one of {', '.join(OBJECTIVES)}")
        if not self.do_train and not self.do_eval:
            raise ConfigError("at least one of do_train or do_eval must be True")
        if self.max_predictions_per_seq <= 0 or self.max_predictions_per_seq > self.max_seq_length:
            raise ConfigError(
                f"max_predictions_per_seq must be in [1, max_seq_length={self.max_seq_length}], "
                f"got {self.max_predictions_per_seq}"
            )
        if self.num_warmup_steps < 0 or self.num_warmup_steps > self.num_train_steps:
            raise ConfigError(
                f"num_warmup_steps must be in [0, num_train_steps={self.num_train_steps}], got {self.num_warmup_steps}"
            )
        if self.eval_batch_size <= 0 or self.max_eval_steps <= 0:
            raise ConfigError("eval_batch_size and max_eval_steps must be positive")
        if self.pack_sequences and self.causal:
            raise ConfigError("pack_sequences needs a bidirectional objective (mlm_nsp or mlm), not "
                                   f"{self.objective!r}")
        if self.masking not in MASKINGS:
            raise ConfigError(f"unknown masking {self.masking!r}; expected one of {', '.join(MASKINGS)}")
        if not 0.0 < self.masked_lm_prob <= 1.0:
            raise ConfigError(f"masked_lm_prob must be in (0, 1], got {self.masked_lm_prob}")
        if self.max_sequences_per_row is not None and self.max_sequences_per_row < 1:
            raise ConfigError(f"max_sequences_per_row must be >= 1, got {self.max_sequences_per_row}")
        try:
            self.train.check()
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if self.do_train and self.num_train_steps % self.train.steps_per_program:
            raise ConfigError(f"num_train_steps {self.num_train_steps} must be a multiple of steps_per_program "
                              f"{self.train.steps_per_program}")
