"""bert_tf: the BERT workflow in TensorFlow 2 and Keras 3."""

import os

# Keras 3 runs on the TensorFlow backend in this package (docs/design.md).
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

# Before TensorFlow loads: no CUDA-probe or saved_model INFO noise on CPU machines, and a
# remote path that cannot be reached ends a script in one line (BERT_TF_VERBOSE=1: off).
from bert_tf import console  # noqa: E402

console.apply()

__version__ = "0.1.0"
