"""Tokens/s of FullTokenizer, FastTokenizer, Hugging Face `tokenizers` and tf-text on one text.

    .venv/bin/python benchmarks/bench_tokenizers.py \
        --vocab_file ../shared/fixtures/vocab/bert-base-uncased-vocab.txt \
        --text_files ../shared/corpora/kjv.txt \
        --xquad_glob '../shared/fixtures/squad/xquad/*.json'

Every row tokenizes the same texts (lines of --text_files, plus XQuAD contexts
and questions) into Python lists, and "tokens/s" always divides the number of
wordpieces FullTokenizer produces by the wall time, best of --repeats passes.
FastTokenizer is shown cold (fresh object, first pass: its chunk caches fill)
and warm. The Rust tokenizer and tf-text run in child processes so that
RAYON_NUM_THREADS / TOKENIZERS_PARALLELISM take effect and so that each gets
its own thread pool. The per-CPU-second column (all threads of the process)
is the steadier number on a shared machine. "differs" is the fraction of texts whose wordpieces are
not exactly FullTokenizer's. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from typing import Callable, List, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(REPO), "shared")
sys.path.insert(0, REPO)


def read_texts(text_files: Sequence[str], xquad_glob: str, max_texts: int) -> List[str]:
    """Non-empty lines of each text file, then XQuAD contexts and questions."""
    texts: List[str] = []
    for path in text_files:
        with open(path, encoding="utf-8") as f:
            texts.extend(line.rstrip("\n") for line in f if line.strip())
    for path in sorted(glob.glob(xquad_glob)) if xquad_glob else []:
        with open(path, encoding="utf-8") as f:
            for article in json.load(f)["data"]:
                for paragraph in article["paragraphs"]:
                    texts.append(paragraph["context"])
                    texts.extend(qa["question"] for qa in paragraph["qas"])
    if not texts:
        sys.exit("bench_tokenizers: no texts read (check --text_files / --xquad_glob)")
    return texts[:max_texts] if max_texts > 0 else texts


def best_time(fn: Callable[[], object], repeats: int):
    """((best wall seconds, best CPU seconds of this process), last output) over `repeats` calls.

    CPU time sums all threads; on a machine shared with other jobs it is the
    steadier number for single-threaded rows.
    """
    wall, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        out = fn()
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return (wall, cpu), out


def batched(fn: Callable[[List[str]], list], texts: List[str], batch_size: int) -> list:
    out: list = []
    for i in range(0, len(texts), batch_size):
        out.extend(fn(texts[i:i + batch_size]))
    return out


# ---------------------------------------------------------------- child processes
def worker_hf(args, texts: List[str]) -> dict:
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(args.vocab_file, clean_text=True, handle_chinese_chars=True,
                                 strip_accents=args.strip_accents, lowercase=args.do_lower_case)

    def pieces(batch):
        return [e.tokens for e in tok.encode_batch(batch, add_special_tokens=False)]

    def ids(batch):
        return [e.ids for e in tok.encode_batch(batch, add_special_tokens=False)]

    t_pieces, out = best_time(lambda: batched(pieces, texts, args.batch_size), args.repeats)
    t_ids, _ = best_time(lambda: batched(ids, texts, args.batch_size), args.repeats)
    return {"seconds": t_pieces, "seconds_ids": t_ids, "pieces": out}


def worker_tftext(args, texts: List[str]) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import tensorflow_text as tf_text

    from bert_tf.tokenization.full import load_vocab

    vocab = list(load_vocab(args.vocab_file))
    inv = vocab
    tok = tf_text.FastBertTokenizer(vocab=vocab, token_out_type=tf.int64,
                                    lower_case_nfd_strip_accents=args.do_lower_case)

    def ids(batch):
        return tok.tokenize(tf.constant(batch)).to_list()

    t_ids, out = best_time(lambda: batched(ids, texts, args.batch_size), args.repeats)
    pieces = [[inv[i] for i in row] for row in out]
    return {"seconds": None, "seconds_ids": t_ids, "pieces": pieces}


def run_child(kind: str, env: dict, args, texts_path: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "out.pkl")
        cmd = [sys.executable, os.path.abspath(__file__), f"--worker={kind}", f"--texts_pickle={texts_path}",
               f"--out_pickle={out_path}", f"--vocab_file={args.vocab_file}", f"--repeats={args.repeats}",
               f"--batch_size={args.batch_size}", f"--do_lower_case={args.do_lower_case}",
               f"--strip_accents={args.strip_accents}"]
        subprocess.run(cmd, env={**os.environ, **env}, check=True)
        with open(out_path, "rb") as f:
            return pickle.load(f)


# ---------------------------------------------------------------- main
def parse_bool(value: str):
    return {"true": True, "false": False, "none": None}[value.lower()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab_file", default=os.path.join(SHARED, "fixtures/vocab/bert-base-uncased-vocab.txt"))
    parser.add_argument("--text_files", nargs="*", default=[os.path.join(SHARED, "corpora/kjv.txt")])
    parser.add_argument("--xquad_glob", default=os.path.join(SHARED, "fixtures/squad/xquad/*.json"))
    parser.add_argument("--max_texts", type=int, default=0, help="0 = all")
    parser.add_argument("--batch_size", type=int, default=10_000, help="texts per encode_batch call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--do_lower_case", type=parse_bool, default=True)
    parser.add_argument("--strip_accents", type=parse_bool, default=None)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="RAYON_NUM_THREADS of the parallel row")
    parser.add_argument("--skip_tftext", action="store_true")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--texts_pickle", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out_pickle", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        with open(args.texts_pickle, "rb") as f:
            texts = pickle.load(f)
        result = {"hf": worker_hf, "tftext": worker_tftext}[args.worker](args, texts)
        with open(args.out_pickle, "wb") as f:
            pickle.dump(result, f)
        return

    from bert_tf.tokenization.fast import FastTokenizer
    from bert_tf.tokenization.full import FullTokenizer

    texts = read_texts(args.text_files, args.xquad_glob, args.max_texts)
    n_chars = sum(map(len, texts))
    full = FullTokenizer(args.vocab_file, do_lower_case=args.do_lower_case, strip_accents=args.strip_accents)
    t_full, reference = best_time(lambda: full.tokenize_batch(texts), 1)
    n_tokens = sum(map(len, reference))

    rows = []  # (name, seconds for wordpieces, seconds for ids, differs)

    def differs(pieces) -> float:
        return sum(a != b for a, b in zip(pieces, reference, strict=True)) / len(reference)

    rows.append(("FullTokenizer (pure Python)", t_full, None, 0.0))

    fast = FastTokenizer(args.vocab_file, do_lower_case=args.do_lower_case, strip_accents=args.strip_accents)
    t_cold, out = best_time(lambda: batched(fast.tokenize_batch, texts, args.batch_size), 1)
    rows.append(("FastTokenizer, cold (new object, 1st pass)", t_cold, None, differs(out)))
    t_warm, out = best_time(lambda: batched(fast.tokenize_batch, texts, args.batch_size), args.repeats)
    t_ids, _ = best_time(lambda: batched(fast.encode_batch, texts, args.batch_size), args.repeats)
    rows.append(("FastTokenizer, warm", t_warm, t_ids, differs(out)))

    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
        pickle.dump(texts, f)
        texts_path = f.name
    try:
        single = run_child("hf", {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}, args, texts_path)
        rows.append(("HF tokenizers BertWordPiece, 1 thread", single["seconds"], single["seconds_ids"],
                     differs(single["pieces"])))
        par = run_child("hf", {"RAYON_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "true"},
                        args, texts_path)
        rows.append((f"HF tokenizers BertWordPiece, {args.threads} threads", par["seconds"], par["seconds_ids"],
                     differs(par["pieces"])))
        if not args.skip_tftext:
            tft = run_child("tftext", {}, args, texts_path)
            rows.append(("tf-text FastBertTokenizer (ids only)", None, tft["seconds_ids"], differs(tft["pieces"])))
    finally:
        os.unlink(texts_path)

    rust, rust_ids = single["seconds"][0], single["seconds_ids"][0]
    print(f"\n{len(texts):,} texts, {n_chars:,} characters, {n_tokens:,} wordpieces (FullTokenizer); "
          f"do_lower_case={args.do_lower_case} strip_accents={args.strip_accents}; batch {args.batch_size}; "
          f"best of {args.repeats}; {os.cpu_count()} CPUs\n")
    print("| tokenizer | wordpieces/s | vs Rust 1 thread | ids/s | vs Rust 1 thread "
          "| wordpieces (or ids) per CPU-second | texts differing from FullTokenizer |")
    print("|---|---:|---:|---:|---:|---:|---:|")

    def cell(seconds, base):
        if seconds is None:
            return "-", "-"
        return f"{n_tokens / seconds[0]:,.0f}", f"{base / seconds[0]:.2f}x"

    for name, seconds, seconds_ids, diff in rows:
        rate, ratio = cell(seconds, rust)
        rate_ids, ratio_ids = cell(seconds_ids, rust_ids)
        per_cpu = f"{n_tokens / (seconds or seconds_ids)[1]:,.0f}"
        print(f"| {name} | {rate} | {ratio} | {rate_ids} | {ratio_ids} | {per_cpu} | {diff:.4%} |")

    examples = [t for t, a, b in zip(texts, single["pieces"], reference, strict=True) if a != b][:3]
    for text in examples:
        print(f"\nHF differs on: {text[:120]!r}")


if __name__ == "__main__":
    main()
