"""The BERT encoder, its heads, the pretraining model and the fine-tuning models."""

from bert_tf.models.encoder import BertEncoder, build_encoder, dummy_inputs
from bert_tf.models.heads import (
    ClassificationHead,
    MaskedLMHead,
    MultipleChoiceHead,
    NextSentenceHead,
    SpanHead,
    TokenTaggingHead,
)
from bert_tf.models.pretrainer import BertPretrainer
from bert_tf.models.task_models import BertClassifier, BertMultipleChoice, BertSpanLabeler, BertTokenClassifier

__all__ = [
    "BertClassifier",
    "BertEncoder",
    "BertMultipleChoice",
    "BertPretrainer",
    "BertSpanLabeler",
    "BertTokenClassifier",
    "ClassificationHead",
    "MaskedLMHead",
    "MultipleChoiceHead",
    "NextSentenceHead",
    "SpanHead",
    "TokenTaggingHead",
    "build_encoder",
    "dummy_inputs",
]
