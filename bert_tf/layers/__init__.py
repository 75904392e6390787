"""Keras 3 building blocks of the BERT encoder (docs/reference.md §3)."""

from bert_tf.layers.activations import gelu, get_activation
from bert_tf.layers.attention import SelfAttention, attention_bias_from_mask, causal_attention_bias
from bert_tf.layers.embeddings import BertEmbeddings
from bert_tf.layers.transformer import TransformerBlock

__all__ = [
    "BertEmbeddings",
    "SelfAttention",
    "TransformerBlock",
    "attention_bias_from_mask",
    "causal_attention_bias",
    "gelu",
    "get_activation",
]
