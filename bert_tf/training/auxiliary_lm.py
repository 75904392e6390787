"""GPT-1's auxiliary objective in fine-tuning: task loss + lambda * LM loss on the task's own inputs.

Radford et al. (2018, §3.2) fine-tune with L3 = L2 + lambda * L1, lambda = 0.5,
where L1 is the pretraining LM loss on the task's inputs. Here L1 is the
objective the encoder was pretrained with:
  * BERT-style (bidirectional) encoders: masked LM on a randomly masked copy of
    each batch (AUX_MASK_RATE of the real, non-special tokens; of those 80%
    [MASK], 10% a random token, 10% kept, as in pretraining). The task loss
    still sees the clean inputs, so the LM term costs one more forward pass.
  * Causal (left-to-right) encoders: next-token prediction on the clean inputs.
The LM output layer is attached to the task model as `.masked_lm` (the
pretrainer's name), so `--init_checkpoint` fills it from the pretraining
checkpoint; it is saved with the fine-tuned model and ignored by the export.

Dimensions: B batch, C choices (multiple choice only), S sequence, V vocab.
"""

from __future__ import annotations

from typing import Callable, Mapping

import tensorflow as tf

from bert_tf.models.heads import MaskedLMHead
from bert_tf.models.language_model import next_token_loss
from bert_tf.models.pretrainer import masked_lm_loss_and_accuracy

# GPT-1's lambda (Radford et al. 2018, §3.2).
GPT_AUX_LM_WEIGHT = 0.5
# Share of real, non-special input tokens masked for the auxiliary masked LM (BERT's rate, §3.1).
AUX_MASK_RATE = 0.15
# Of the masked tokens: replaced by [MASK], by a random token; the rest are kept (BERT §3.1).
AUX_MASK_TOKEN_SHARE = 0.8
AUX_RANDOM_TOKEN_SHARE = 0.1
SPECIAL_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")
INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")


def attach_lm_head(model) -> MaskedLMHead:
    """Adds the LM output layer as `model.masked_lm` (model has `.encoder`); returns it."""
    config = model.encoder.config
    head = MaskedLMHead(config.vocab_size, config.hidden_size, config.hidden_act, config.initializer_range,
                        name="masked_lm", layer_norm_eps=config.layer_norm_eps)
    head.build()
    model.masked_lm = head
    return head


def random_masking(input_ids, input_mask, *, mask_id: int, special_ids, vocab_size: int,
                   rate: float = AUX_MASK_RATE, seed=None):
    """Masks a random AUX_MASK_RATE of the real, non-special tokens.

    input_ids, input_mask: int [B, S]. Returns (masked input_ids int32 [B, S],
    labels int32 [B, S] = the original ids, weights float32 [B, S] = 1 where a
    token was chosen). `seed`: a stateless seed int32 [2], or None for the
    global generator.
    """
    input_ids = tf.cast(input_ids, tf.int32)
    shape = tf.shape(input_ids)

    def uniform(i):
        if seed is None:
            return tf.random.uniform(shape)
        return tf.random.stateless_uniform(shape, seed=tf.stack([seed[0], seed[1] + i]))

    special = tf.reduce_any(input_ids[..., None] == tf.constant(list(special_ids), tf.int32), axis=-1)  # [B, S]
    candidate = tf.logical_and(tf.cast(input_mask, tf.bool), tf.logical_not(special))
    chosen = tf.logical_and(candidate, uniform(0) < rate)  # [B, S]
    how = uniform(1)
    to_mask = tf.logical_and(chosen, how < AUX_MASK_TOKEN_SHARE)
    to_random = tf.logical_and(chosen, tf.logical_and(how >= AUX_MASK_TOKEN_SHARE,
                                                      how < AUX_MASK_TOKEN_SHARE + AUX_RANDOM_TOKEN_SHARE))
    random_ids = tf.cast(tf.floor(uniform(2) * vocab_size), tf.int32)
    masked = tf.where(to_mask, tf.fill(shape, mask_id), tf.where(to_random, random_ids, input_ids))
    return masked, input_ids, tf.cast(chosen, tf.float32)


def auxiliary_lm_loss(model, batch: Mapping[str, tf.Tensor], *, causal: bool, mask_id: int, special_ids,
                      training: bool):
    """L1 on the batch's encoder inputs (any leading shape, e.g. [B, C, S]) -> (loss, accuracy, count)."""
    seq_length = tf.shape(batch["input_ids"])[-1]
    inputs = {k: tf.reshape(tf.cast(batch[k], tf.int32), (-1, seq_length)) for k in INPUT_KEYS}  # [B*, S]
    if causal:
        return next_token_loss(model.encoder, model.masked_lm, inputs, training=training)
    masked, labels, weights = random_masking(inputs["input_ids"], inputs["input_mask"], mask_id=mask_id,
                                             special_ids=special_ids, vocab_size=model.encoder.config.vocab_size)
    outputs = model.encoder(dict(inputs, input_ids=masked), training=training)
    positions = tf.broadcast_to(tf.range(seq_length)[None, :], tf.shape(masked))  # [B*, S]: every position
    logits = model.masked_lm(outputs["sequence_output"], positions, model.encoder.word_embeddings)  # [B*, S, V]
    loss, accuracy = masked_lm_loss_and_accuracy(logits, labels, weights)
    return loss, accuracy, tf.reduce_sum(weights)


def with_auxiliary_lm(model_fn: Callable, loss_fn: Callable, weight: float, *, causal: bool,
                      vocab: Mapping[str, int]):
    """(model_fn, loss_fn) for the Trainer with `weight * L1` added to the task loss.

    model_fn' builds the task model and attaches the LM head; loss_fn' returns
    task loss + weight * L1 and reports "aux_lm_loss" / "aux_lm_accuracy".
    `vocab`: token -> id (for [MASK] and the special tokens never masked).
    """
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing and not causal:
        raise ValueError(f"aux_lm_weight: the vocab has no {', '.join(missing)} (needed to mask inputs)")
    mask_id = vocab.get("[MASK]", 0)
    special_ids = [vocab[t] for t in SPECIAL_TOKENS if t in vocab]

    def aux_model_fn():
        model = model_fn()
        attach_lm_head(model)
        return model

    def aux_loss_fn(model, batch, training):
        task_loss, metrics = loss_fn(model, batch, training)
        lm_loss, lm_accuracy, count = auxiliary_lm_loss(model, batch, causal=causal, mask_id=mask_id,
                                                        special_ids=special_ids, training=training)
        metrics = dict(metrics, task_loss=task_loss, aux_lm_loss=(lm_loss, count),
                       aux_lm_accuracy=(lm_accuracy, count))
        return task_loss + weight * lm_loss, metrics

    return aux_model_fn, aux_loss_fn
