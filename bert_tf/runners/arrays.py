"""How a fine-tuning run's featurized arrays reach the model: tf.data over them (with length
bucketing and dynamic padding), their fingerprint, and batched prediction in order.

Dimensions: N examples, S sequence length.
"""

from __future__ import annotations

import hashlib
import time
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from bert_tf.errors import ConfigError
from bert_tf.runners.shapes import choose_lengths, example_lengths

# Batches are padded up to a multiple of this under dynamic padding: few distinct
# shapes (fewer retraces) while short batches still skip most of the padding.
PAD_TO_MULTIPLE = 16
# Length buckets (in tokens) that group training examples of similar length.
BUCKET_BOUNDARIES = (16, 32, 48, 64, 96, 128, 192, 256, 384)
# Feature arrays whose last axis is the sequence axis (trimmed with dynamic padding).
SEQUENCE_KEYS = ("input_ids", "input_mask", "segment_ids", "label_ids", "label_mask")


# ------------------------------------------------------------------ tf.data over arrays
def trim_padding(batch: Dict[str, tf.Tensor], multiple: int = PAD_TO_MULTIPLE,
                 lengths: Optional[Sequence[int]] = None) -> Dict[str, tf.Tensor]:
    """Cuts the sequence axis of a padded batch to its longest example, rounded up to `multiple`, or
    with `lengths` (ascending, bert_tf.runners.shapes.choose_lengths) to the shortest of them that holds it."""
    mask = batch["input_mask"]
    longest = tf.reduce_max(tf.reduce_sum(tf.cast(mask, tf.int32), axis=-1))
    full = tf.shape(mask)[-1]
    if lengths:
        chosen = tf.constant(list(lengths) + [2**30], tf.int32)  # a longest beyond them all keeps the full length
        length = tf.minimum(full, tf.gather(chosen, tf.searchsorted(chosen, [longest], side="left"))[0])
    else:
        length = tf.minimum(full, (longest + multiple - 1) // multiple * multiple)
    # label_ids is per token only for tagging ([B, S]); per example ([B]) it is left alone.
    return {k: (v[..., :length] if k in SEQUENCE_KEYS and v.shape.rank >= 2 else v) for k, v in batch.items()}


def arrays_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """A short fingerprint of featurized arrays (names, shapes, bytes): the training input's identity
    for resuming its position (bert_tf.training.checkpointing.input_signature)."""
    digest = hashlib.blake2b(digest_size=8)
    for name in sorted(arrays):
        value = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}{value.shape}{value.dtype}".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def arrays_dataset_fn(arrays: Mapping[str, np.ndarray], *, training: bool, seed: int = 12345,
                      dynamic_padding: bool = True, bucket_by_length: bool = True,
                      lengths: Optional[Sequence[int]] = None, micro_batches: int = 1) -> Callable:
    """dataset_fn(input_context, batch_size) for the Trainer over in-memory feature arrays.

    Training repeats and shuffles; with `dynamic_padding` each batch is cut to its
    longest example, and `bucket_by_length` groups examples of similar length so
    short sentences do not pay for `max_seq_length` (keep both off on TPU, which
    wants fixed shapes). Evaluation keeps the order and the last partial batch.
    `lengths` (XLA's static shapes, bert_tf.runners.shapes): training batches are drawn per length
    bucket (examples longer than lengths[i - 1], at most lengths[i]) and cut to their bucket's length,
    so every batch has one of len(lengths) shapes; this replaces dynamic_padding and bucket_by_length.
    micro_batches: training batches come in runs of this many of one shape (gradient accumulation: the
    Trainer stacks them into one step, which needs one shape), cut from one batch of micro_batches x
    batch_size examples.
    """
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    n = len(arrays["input_ids"])
    if lengths:
        dynamic_padding, bucket_by_length = True, True

    def dataset_fn(ctx: tf.distribute.InputContext, micro_batch_size: int) -> tf.data.Dataset:
        group = micro_batches if training and dynamic_padding else 1  # batches cut alike
        batch_size = micro_batch_size * group
        ds = tf.data.Dataset.from_tensor_slices(arrays)
        if ctx.num_input_pipelines > 1:
            ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        if training:
            ds = ds.shuffle(min(n, 100_000), seed=seed, reshuffle_each_iteration=True).repeat()
            if dynamic_padding and bucket_by_length:
                seq = arrays["input_ids"].shape[-1]
                # bucket_by_sequence_length's bucket i holds lengths below bounds[i]
                bounds = [n + 1 for n in lengths[:-1]] if lengths else [b for b in BUCKET_BOUNDARIES if b < seq]

                def length(x):
                    # Multiple choice: [C, S]; the longest choice decides.
                    return tf.reduce_max(tf.reduce_sum(tf.cast(x["input_mask"], tf.int32), axis=-1))

                ds = ds.bucket_by_sequence_length(length, bounds, [batch_size] * (len(bounds) + 1),
                                                  drop_remainder=True)
            else:
                ds = ds.batch(batch_size, drop_remainder=True)
        else:
            ds = ds.batch(batch_size)
        if dynamic_padding:
            ds = ds.map(lambda b: trim_padding(b, lengths=lengths), num_parallel_calls=tf.data.AUTOTUNE)
        if group > 1:  # [group * b, ...] -> `group` batches [b, ...] of one shape, one after another
            ds = ds.flat_map(lambda b: tf.data.Dataset.from_tensor_slices(
                {k: tf.reshape(v, tf.concat([[group, micro_batch_size], tf.shape(v)[1:]], 0)) for k, v in b.items()}))
        return ds.prefetch(tf.data.AUTOTUNE)

    return dataset_fn


def training_input(arrays: Mapping[str, np.ndarray], *, seed: int = 12345, dynamic_padding: bool = True,
                   lengths: Optional[Sequence[int]] = None, micro_batches: int = 1) -> Tuple[Callable, str]:
    """(dataset_fn, input_id) of a training run over featurized arrays: arrays_dataset_fn's training
    pipeline and the arrays' fingerprint, by which a resumed run knows it reads the same input."""
    return (arrays_dataset_fn(arrays, training=True, seed=seed, dynamic_padding=dynamic_padding, lengths=lengths,
                              micro_batches=micro_batches),
            arrays_digest(arrays))


class Predictor:
    """Runs a model over all examples in order, batch by batch, with one traced forward function
    for the whole run (periodic evaluations do not trace again); outputs as numpy, concatenated over N.

    dynamic_padding: examples are sorted by length (then put back in order) and each batch is cut
    to its longest example, so a batch is about as long as its own examples. Otherwise every batch
    has the same shape, the last one filled up with all-zero examples whose outputs are dropped:
    under XLA (`jit_compile`) one program serves every batch of a size (`traces` counts them).
    sequence_outputs: the outputs are per token ([B, S, ...], e.g. span logits, tags); cut batches
    are padded back to the full S with -10000 (never picked by an argmax).
    length_buckets: > 0 (XLA's static shapes): examples sorted by length as with dynamic_padding, every
    batch full (the last one filled up) and cut to one of at most this many lengths chosen from the
    examples' own (bert_tf.runners.shapes.choose_lengths; `lengths` holds the last call's).
    compile_seconds: the wall time of the calls that traced a new program (under XLA: compiling it and
    running that one batch).
    strategy: run each batch on the strategy's replicas (a slice each, outputs joined in order), where
    the model's variables live: the TPU cores, the GPUs. Batches are then always full (the last one
    filled up) and a multiple of the replicas. A multi-worker strategy is not used: every worker
    predicts everything with its own copy of the weights (they are the same on every worker).
    """

    def __init__(self, model, *, sequence_outputs: bool = False, dynamic_padding: bool = True,
                 jit_compile: bool = False, strategy: Optional[tf.distribute.Strategy] = None,
                 length_buckets: int = 0):
        self.sequence_outputs = sequence_outputs
        self.dynamic_padding = dynamic_padding
        self.length_buckets = length_buckets
        self.lengths: Optional[Tuple[int, ...]] = None
        self.compile_seconds = 0.0
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            strategy = None
        self.strategy = strategy

        def forward(batch):
            return model(batch, training=False)

        self._forward = tf.function(forward, jit_compile=jit_compile, reduce_retracing=not jit_compile,
                                    autograph=False)
        if strategy is not None:
            # The compiled function is called from a Python one: given to strategy.run itself, a
            # compiled function reads one replica's variables from another's device.
            self._replicated = tf.function(lambda batch: strategy.run(lambda b: self._forward(b), args=(batch,)),
                                           autograph=False, reduce_retracing=not jit_compile)

    def _run(self, batch, replicas: int):
        if self.strategy is None:
            return self._forward(batch)
        per_replica = batch["input_ids"].shape[0] // replicas
        sliced = self.strategy.experimental_distribute_values_from_function(
            lambda ctx: {k: v[ctx.replica_id_in_sync_group * per_replica:(ctx.replica_id_in_sync_group + 1) * per_replica]
                         for k, v in batch.items()})
        outputs = self._replicated(sliced)
        return tf.nest.map_structure(lambda t: tf.concat(self.strategy.experimental_local_results(t), axis=0), outputs)

    @property
    def traces(self) -> int:
        """How many times the forward function was traced: compiled programs under XLA."""
        return self._forward.experimental_get_tracing_count()

    def __call__(self, arrays: Mapping[str, np.ndarray], batch_size: int,
                 input_keys: Sequence[str] = ("input_ids", "input_mask", "segment_ids")):
        inputs = {k: np.asarray(arrays[k]) for k in input_keys}
        n = len(inputs["input_ids"])
        if not n:
            raise ConfigError("nothing to predict: no examples")
        full = inputs["input_ids"].shape[-1]
        cut = self.dynamic_padding or self.length_buckets > 0
        if self.length_buckets:
            self.lengths = choose_lengths(example_lengths(inputs["input_mask"]), full, self.length_buckets)
        if cut:
            order = np.argsort(-inputs["input_mask"].reshape(n, -1).sum(axis=-1), kind="stable")
        else:
            order = np.arange(n)

        def to_full(t):
            t = t.numpy()
            if self.sequence_outputs and t.shape[1] < full:
                t = np.pad(t, [(0, 0), (0, full - t.shape[1])] + [(0, 0)] * (t.ndim - 2), constant_values=-1e4)
            return t

        replicas = self.strategy.num_replicas_in_sync if self.strategy is not None else 1
        if batch_size % replicas:
            raise ConfigError(f"batch size {batch_size} must be a multiple of the {replicas} replicas")
        fill = not self.dynamic_padding or self.length_buckets > 0 or self.strategy is not None
        chunks = []
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            batch = {k: v[idx] for k, v in inputs.items()}
            if fill and len(idx) < batch_size:  # the same shape as every other batch
                batch = {k: np.concatenate([v, np.zeros((batch_size - len(idx),) + v.shape[1:], v.dtype)])
                         for k, v in batch.items()}
            batch = {k: tf.constant(v) for k, v in batch.items()}
            if cut:
                batch = trim_padding(batch, lengths=self.lengths if self.length_buckets else None)
            traces, began = self.traces, time.perf_counter()
            outputs = tf.nest.map_structure(to_full, self._run(batch, replicas))
            if self.traces > traces:
                self.compile_seconds += time.perf_counter() - began
            chunks.append(tf.nest.map_structure(lambda a, m=len(idx): a[:m], outputs))
        joined = tf.nest.map_structure(lambda *parts: np.concatenate(parts, axis=0), *chunks)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(n)
        return tf.nest.map_structure(lambda a: a[inverse], joined)


__all__ = [
    "Predictor",
    "arrays_dataset_fn",
    "arrays_digest",
    "training_input",
    "trim_padding",
]
