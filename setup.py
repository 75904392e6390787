"""Installs the `bert_tf` library; the user-facing scripts stay at the repository root."""

from setuptools import find_packages, setup

# What the fast subset (pytest -m "not slow") needs: it installs beside TensorFlow 2.21 too, where
# scripts/test.sh runs that subset in a second venv (the oracles below are 2.20-only or not needed there).
TEST_FAST = ["pytest>=8", "pytest-xdist>=3.5"]
TEST = TEST_FAST + [
    "ruff==0.8.6",
    "tokenizers>=0.20",  # the Rust WordPiece peer in benchmarks and a parity oracle
    "safetensors>=0.4",
    "tf-models-official==2.20.0",  # independent oracle for the encoder and the data tool
    # Hugging Face PyTorch, the oracle for HF numerics and write-back (tests/test_hf_fidelity.py).
    # The CPU build of torch: scripts/venv.sh installs it first (PyPI's Linux wheel pulls CUDA).
    "torch==2.13.0",
    "transformers==5.23.0",
    # TF-Hub's BERT workflow on our exports (tests/test_hub.py): hub.KerasLayer in a tf_keras model.
    "tensorflow-hub==0.16.1",
    "tf-keras==2.20.1",
    "setuptools<81",  # tensorflow-hub 0.16.1 (the latest) imports pkg_resources, which setuptools 81 removed
]
# Apache Beam for the data-parallel tools beyond one machine (README "Beyond one machine"); [gcp] brings
# the Dataflow runner and gs:// file system (without it every run logs a GCS-filesystem warning).
# Not the [tft] extra: tfx-bsl does not fit TensorFlow 2.20. The tests (tests/test_beam.py) use the same.
BEAM = ["apache-beam[gcp]==2.77.0"]
TEST += BEAM
# The ONNX export (export_savedmodel.py --export_format=onnx) and serving it with ONNX Runtime (predict.py);
# these versions install beside TensorFlow 2.20, numpy 2 and protobuf 6 (tests/test_export_onnx.py).
ONNX = ["tf2onnx==1.17.0", "onnx==1.23.2", "onnxruntime==1.32.0"]
TEST += ONNX

setup(
    name="bert_tf",
    version="0.1.0",
    description="The BERT workflow (vocab, pretraining data, pretraining, fine-tuning, export) in TensorFlow 2 / Keras 3",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["bert_tf", "bert_tf.*"]),
    package_data={"bert_tf.resources": ["*.txt", "testament/*.tsv"]},
    python_requires=">=3.10,<3.13",
    install_requires=[
        # 2.20 (what tensorflow-tpu and tf-models-official still are; the tests' venv) or 2.21: pip pairs
        # tensorflow-text with its TensorFlow (tensorflow-text 2.21 requires tensorflow >=2.21,<2.22).
        "tensorflow>=2.20,<2.22",
        "tensorflow-text>=2.20,<2.22",
        # tf.summary.text/scalar and the HParams API need it; TensorFlow 2.21 no longer installs it.
        "tensorboard>=2.20",
        "keras>=3.10,<4",
        "absl-py>=1.0",
        "numpy",
        "safetensors>=0.4",  # Hugging Face BERT weights
        "google-crc32c>=1.5",  # TFRecord framing without TensorFlow in the data workers (3x faster than pure Python)
    ],
    extras_require={
        "test": TEST,
        "test-fast": TEST_FAST,
        "beam": BEAM,
        "onnx": ONNX,
        "tfm": ["tf-models-official==2.20.0"],
        "experiments": ["matplotlib"],  # experiments/ablations.py's plot
        # TensorBoard's Profile tab for --profile_steps captures (resolves beside TensorFlow 2.20).
        "profile": ["tensorboard-plugin-profile>=2.20"],
        # NVIDIA GPUs (Linux x86_64): TensorFlow's own extra brings CUDA 12 and cuDNN 9 from pip.
        "gpu": ["tensorflow[and-cuda]>=2.20,<2.22"],
    },
    license="Apache-2.0",
)
