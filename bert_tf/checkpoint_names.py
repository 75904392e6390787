"""The one name map between our Keras models and the original TF1 checkpoints' variable names.

`tf1_variable_map` ties every variable of our models (encoder and heads) to its original TF1 name, as the
original's modeling.py and heads create them; `hf_name` derives each Hugging Face name from a TF1 name, so
there is nothing else to keep in sync. bert_tf.checkpoints reads and writes the formats with it.
"""

from __future__ import annotations

import re
from typing import Any, Dict

from bert_tf.models import heads
from bert_tf.models.encoder import BertEncoder


def encoder_of(model):
    """The BertEncoder of a task or pretraining model (the model itself when it is one)."""
    if isinstance(model, BertEncoder):
        return model
    encoder = getattr(model, "encoder", None)
    if not isinstance(encoder, BertEncoder):
        raise TypeError(f"{type(model).__name__} is not a BertEncoder and has no .encoder")
    return encoder


def _dense(prefix, layer):
    return {f"{prefix}/kernel": layer.kernel, f"{prefix}/bias": layer.bias}


def _layer_norm(prefix, layer):
    return {f"{prefix}/gamma": layer.gamma, f"{prefix}/beta": layer.beta}


def _projection(prefix, projection):
    return {f"{prefix}output_weights": projection.output_weights, f"{prefix}output_bias": projection.output_bias}


def tf1_variable_map(model) -> Dict[str, Any]:
    """Original TF1 name -> our variable, for an encoder, a pretrainer or a task model.

    Every head stores its output weights in the original [out, in] layout, so
    values copy across unchanged (no transposes) in both directions.
    """

    encoder = encoder_of(model)
    emb = encoder.embeddings
    names = {
        "bert/embeddings/word_embeddings": emb.word_embeddings.embeddings,
        "bert/embeddings/token_type_embeddings": emb.token_type_embeddings.embeddings,
        "bert/embeddings/position_embeddings": emb.position_embeddings,
        **_layer_norm("bert/embeddings/LayerNorm", emb.layer_norm),
    }
    for i, block in enumerate(encoder.blocks):
        p = f"bert/encoder/layer_{i}"
        names.update(_dense(f"{p}/attention/self/query", block.attention.query))
        names.update(_dense(f"{p}/attention/self/key", block.attention.key))
        names.update(_dense(f"{p}/attention/self/value", block.attention.value))
        names.update(_dense(f"{p}/attention/output/dense", block.attention.output_dense))
        names.update(_layer_norm(f"{p}/attention/output/LayerNorm", block.attention_layer_norm))
        names.update(_dense(f"{p}/intermediate/dense", block.intermediate))
        names.update(_dense(f"{p}/output/dense", block.output_dense))
        names.update(_layer_norm(f"{p}/output/LayerNorm", block.output_layer_norm))
    names.update(_dense("bert/pooler/dense", encoder.pooler))

    if model is encoder:
        return names
    for attr in ("masked_lm", "next_sentence", "head"):
        head = getattr(model, attr, None)
        if head is None:
            continue
        if isinstance(head, heads.MaskedLMHead):
            names.update(_dense("cls/predictions/transform/dense", head.transform))
            names.update(_layer_norm("cls/predictions/transform/LayerNorm", head.layer_norm))
            names["cls/predictions/output_bias"] = head.output_bias
        elif isinstance(head, heads.NextSentenceHead):
            names.update(_projection("cls/seq_relationship/", head.projection))
        elif isinstance(head, heads.SpanHead):
            names.update(_projection("cls/squad/", head.projection))
        elif isinstance(head, (heads.ClassificationHead, heads.MultipleChoiceHead, heads.TokenTaggingHead)):
            # run_classifier.py's top-level names; SWAG and NER ports of it use the same.
            names.update(_projection("", head.projection))
        else:
            raise TypeError(f"no original checkpoint names for head {type(head).__name__}")
    return names


_HF_SPECIAL = {
    "cls/predictions/output_bias": "cls.predictions.bias",
    "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
    "cls/seq_relationship/output_bias": "cls.seq_relationship.bias",
    "cls/squad/output_weights": "qa_outputs.weight",
    "cls/squad/output_bias": "qa_outputs.bias",
    "output_weights": "classifier.weight",
    "output_bias": "classifier.bias",
}
_HF_LEAF = {"kernel": "weight", "gamma": "weight", "beta": "bias", "bias": "bias"}


def hf_name(tf1_name: str, bert_prefix: str = "") -> str:
    """The Hugging Face name of an original TF1 variable name.

    `bert_prefix` is "bert." for BertFor* files and "" for BertModel files.
    Values whose TF1 name ends in `kernel` are transposed ([in, out] vs [out, in]).
    """
    if tf1_name in _HF_SPECIAL:
        return _HF_SPECIAL[tf1_name]
    parts = tf1_name.split("/")
    is_bert = parts[0] == "bert"
    if is_bert:
        parts = parts[1:]
    parts = [re.sub(r"^layer_(\d+)$", r"layer.\1", p) for p in parts]
    if parts[-1] in _HF_LEAF:
        parts[-1] = _HF_LEAF[parts[-1]]
    else:  # an embedding table
        parts.append("weight")
    return (bert_prefix if is_bert else "") + ".".join(parts)
