"""bert_tf: the BERT workflow in TensorFlow 2 and Keras 3."""

import os

# Keras 3 runs on the TensorFlow backend in this package (DESIGN.md).
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

__version__ = "0.1.0"
