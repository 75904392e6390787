"""How to train (`TrainSettings`), the same for pretraining and fine-tuning: plain values, checked
without TensorFlow (the scripts check them before it loads; bert_flags.py).

Also the names these settings choose from: the optimizers, the precisions, the original's
weight decay and clip norm (docs/reference.md §4).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

# docs/reference.md §4: the original's AdamWeightDecayOptimizer hyper-parameters (with
# bert_tf/training/optimizer.py's betas and epsilon).
WEIGHT_DECAY_RATE = 0.01
CLIP_NORM = 1.0
OPTIMIZERS = ("adamw", "lamb")
# Compute precision -> Keras' dtype policy (bert_tf/training/step.py dtype_policy).
PRECISIONS = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """How to train, the same for pretraining and fine-tuning (not what to train, nor for how long).

    bert_flags.train_settings builds it from the flags every training script shares; the run says
    its own model_dir, number of steps, global batch size and warmup.
    jit_compile: XLA-compile the step. Build models that skip padding with skip_padding=False
      for it (bert_tf/models/encoder.py: the real-token count changes from batch to batch).
    seed: the Trainer calls keras.utils.set_random_seed(seed) before it builds the model (None: left as it is).
    """

    learning_rate: float = 5e-5
    # The task head's peak rate (the model's `head`, e.g. a classifier's output layer), on the same
    # warmup and decay; None: learning_rate. A fresh head on a small-scale feature (a mean-pooled
    # sentence encoder) barely moves at an encoder's rate (docs/finetuning.md).
    head_learning_rate: Optional[float] = None
    optimizer: str = "adamw"
    weight_decay_rate: float = WEIGHT_DECAY_RATE
    clip_norm: float = CLIP_NORM
    mixed_precision: str = "float32"
    jit_compile: bool = False
    # The whole step (forward, loss, gradients, clipping, optimizer update) as one XLA program rather
    # than the gradient step and the update apart (step.py TrainStep whole_step): one device, with
    # jit_compile; the scripts' default on one GPU (bert_setup.use_whole_step; 1.10x on an H200).
    compile_whole_step: bool = False
    # Recompute each Transformer block's activations in the backward pass instead of keeping them
    # (BertEncoder.gradient_checkpointing): the same gradients, the activation memory of one block at
    # a time for about one more forward pass per step (docs/pretraining.md).
    gradient_checkpointing: bool = False
    # Clock each step's wait for its batch (speed/input_wait_* in TensorBoard). The clock orders the host
    # after each step's outputs, so an accelerator idles while the host fetches the next batch and enqueues
    # the next step; off, the host runs ahead (benchmarks/bench_pretraining.py +noclock). None: on where the
    # step runs on the CPU (nothing to overlap there), off on a GPU or TPU (Trainer.input_wait_clock).
    input_wait_clock: Optional[bool] = None
    # One device: feed the steps batches already on the device (tf.distribute's input with
    # experimental_fetch_to_device, as multi-device strategies always have it) instead of the plain
    # dataset, whose batches the step copies from the host. Its iterator cannot be saved: a resumed run
    # skips the consumed batches instead (benchmarks/bench_pretraining.py +devfeed, a GPU candidate).
    device_input: bool = False
    # K whole training steps per compiled program: the dataset is batched again by K and one XLA program runs
    # the K steps over those batches in a loop on the device (step.py TrainStep.program_fn), so the host
    # launches one program per K steps. Needs compile_whole_step; host calls, checkpoints and the run's steps
    # come in multiples of K (benchmarks/bench_pretraining.py +k8, a GPU candidate).
    steps_per_program: int = 1
    # Steps per host call, each ending with a log line; None (the default): chosen from the measured step
    # time, so a line comes at least every ~30 s and at each tenth of the run (training/host_calls.py).
    iterations_per_loop: Optional[int] = None
    save_checkpoints_steps: int = 1000
    keep_checkpoint_max: int = 5
    gradient_accumulation_steps: int = 1
    seed: Optional[int] = 12345
    # (first, last): capture a TensorBoard profile of these global steps (1-based, inclusive) into
    # model_dir/train/plugins/profile (the chief's). None: no profile.
    profile_steps: Optional[Tuple[int, int]] = None

    def check(self) -> None:
        """One-line ValueErrors for settings no run can use: the scripts' gate calls it (bert_flags) before
        TensorFlow loads; the library trusts a checked TrainSettings and does not check again."""
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        if self.head_learning_rate is not None and not self.head_learning_rate > 0:
            raise ValueError(f"head_learning_rate must be positive, got {self.head_learning_rate}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; expected one of {', '.join(OPTIMIZERS)}")
        if self.iterations_per_loop is not None and self.iterations_per_loop <= 0:
            raise ValueError(f"iterations_per_loop must be positive, got {self.iterations_per_loop}")
        if self.save_checkpoints_steps <= 0:
            raise ValueError(f"save_checkpoints_steps must be positive, got {self.save_checkpoints_steps}")
        if self.keep_checkpoint_max <= 0:
            raise ValueError(f"keep_checkpoint_max must be positive, got {self.keep_checkpoint_max}")
        if self.gradient_accumulation_steps <= 0:
            raise ValueError(f"gradient_accumulation_steps must be positive, got {self.gradient_accumulation_steps}")
        if self.profile_steps is not None:
            first, last = self.profile_steps
            if not 1 <= first <= last:
                raise ValueError(f"profile_steps must be N,M with 1 <= N <= M, got {first},{last}")
        if self.steps_per_program <= 0:
            raise ValueError(f"steps_per_program must be positive, got {self.steps_per_program}")
        k = self.steps_per_program
        for name, value in (("iterations_per_loop", self.iterations_per_loop),
                            ("save_checkpoints_steps", self.save_checkpoints_steps)):
            if value is not None and value % k:
                raise ValueError(f"{name} {value} must be a multiple of steps_per_program {k}")
        if k > 1 and self.profile_steps is not None and ((self.profile_steps[0] - 1) % k or self.profile_steps[1] % k):
            first, last = self.profile_steps
            raise ValueError(f"profile_steps {first},{last} must cover whole programs of steps_per_program {k} "
                             f"steps (N - 1 and M multiples of {k})")
        if self.mixed_precision not in PRECISIONS:
            raise ValueError(f"mixed_precision must be one of {', '.join(PRECISIONS)}, got {self.mixed_precision!r}")

    def validate(self, num_replicas: int, *, train_steps: int, global_batch_size: int) -> None:
        """One-line ValueErrors for what only the run knows: its steps (from the data) and the replicas
        (from the strategy). The rest is check()'s, done before."""
        if train_steps <= 0:
            raise ValueError(f"num_train_steps must be positive, got {train_steps}")
        if self.steps_per_program > 1 and not self.compile_whole_step:  # (decided with the strategy: not check()'s)
            raise ValueError(f"steps_per_program {self.steps_per_program} runs whole steps in one XLA program: "
                             "it needs compile_whole_step")
        if train_steps % self.steps_per_program:
            raise ValueError(f"num_train_steps {train_steps} must be a multiple of steps_per_program "
                             f"{self.steps_per_program}")
        split = num_replicas * self.gradient_accumulation_steps
        if global_batch_size <= 0 or global_batch_size % split:
            raise ValueError(
                f"train_batch_size {global_batch_size} must be a positive multiple of replicas ({num_replicas}) "
                f"x gradient_accumulation_steps ({self.gradient_accumulation_steps})"
            )

    @property
    def num_micro_batches(self) -> int:
        return self.gradient_accumulation_steps
