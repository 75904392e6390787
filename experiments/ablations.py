"""The BERT paper's pretraining ablations in miniature (Table 5, Figure 5), on a CPU.

Pretrains the same tiny BERT with each objective for the same number of steps
on a public-domain corpus (the full KJV from ../shared/corpora when present,
else the bundled 60-chapter sample):

  mlm_nsp  masked LM + next sentence prediction (BERT)
  mlm      masked LM only ("No NSP")
  ltr      left-to-right LM with a causal attention mask ("LTR & No NSP"; fine-tuned causal too)

then fine-tunes every objective's intermediate checkpoints (and a model with
no pretraining) on three small tasks that ship with bert_tf or are generated
here from the corpus:

  testament  sentence classification: is a verse from the Old or the New Testament (bundled)
  nextverse  sentence pair: is B the verse right after A, or a random verse (generated)
  wordspan   SQuAD-format span extraction from one verse (generated): "What word follows
             'the LORD'?" (left context) or "What word comes before 'unto Moses'?" (right
             context, which a left-to-right model cannot see at the answer's position)

and writes results.csv (every run), results.md (the final checkpoints side by side)
and dev_vs_pretraining_steps.png (the paper's Figure 5: dev metric against
pretraining steps). Fine-tuning uses one seed per point; differences of a
point or two are within seed noise at this scale.

  python experiments/ablations.py --output_dir=ablations_output            # ~40-60 min, 2-core CPU
  python experiments/ablations.py --output_dir=/tmp/ablations --quick      # ~3 min, a smoke test
"""

import csv
import json
import logging
import os
import random
import sys
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

flags.DEFINE_string("output_dir", "ablations_output", "Where data, models, the table and the plot go.")
flags.DEFINE_string("corpus", None, "One verse per line, blank lines between chapters (default: "
                    "../shared/corpora/kjv_pretraining.txt when present, else the bundled KJV sample).")
flags.DEFINE_bool("quick", False, "A smoke test: a small corpus slice, tiny model, few steps (minutes).")
flags.DEFINE_integer("pretrain_steps", None, "Pretraining steps per objective (default 2000; quick 30).")
flags.DEFINE_integer("num_checkpoints", None, "Evaluated checkpoints per objective, evenly spaced (default 3; "
                     "quick 2).")
flags.DEFINE_list("objectives", ["mlm_nsp", "mlm", "ltr"], "Pretraining objectives to compare.")
flags.DEFINE_list("tasks", ["testament", "nextverse", "wordspan"], "Fine-tuning tasks.")
flags.DEFINE_integer("seed", 12345, "Seed for data generation, pretraining and fine-tuning.")
FLAGS = flags.FLAGS

# The sizes of the full run: every number that changes results, named once.
FULL = dict(max_corpus_lines=12000, vocab_size=3000, hidden_size=128, num_layers=2, num_heads=2, seq=64,
            predictions=10, dupe_factor=2, pretrain_steps=2000, pretrain_batch=32, pretrain_lr=4e-4,
            num_checkpoints=3, finetune_lr=1e-4, finetune_batch=32, finetune_epochs=2.0,
            pair_train=2400, pair_dev=600, span_train=2400, span_dev=600, testament_train=None)
QUICK = dict(max_corpus_lines=400, vocab_size=600, hidden_size=32, num_layers=2, num_heads=2, seq=48,
             predictions=8, dupe_factor=1, pretrain_steps=30, pretrain_batch=16, pretrain_lr=1e-3,
             num_checkpoints=2, finetune_lr=1e-3, finetune_batch=16, finetune_epochs=1.0,
             pair_train=96, pair_dev=48, span_train=96, span_dev=48, testament_train=96)
NO_PRETRAINING = "none"
TASK_METRICS = {"testament": "eval_accuracy", "nextverse": "eval_accuracy", "wordspan": "exact_match"}

logger = logging.getLogger("ablations")


# ------------------------------------------------------------------ files
def write_tsv(path, header, rows):
    from bert_tf.fileio import write_text_atomic

    def clean(x):
        return str(x).replace("\t", " ").replace("\n", " ")

    write_text_atomic(path, "\n".join("\t".join(clean(x) for x in row) for row in [header, *rows]) + "\n")


# ------------------------------------------------------------------ steps
def build_data(out, corpus, sizes, seed):
    """Vocab, pretraining TFRecords and the generated tasks under out/data; returns their paths."""
    from bert_tf.data import pretraining_job
    from bert_tf.fileio import write_text_atomic
    from bert_tf.resources import TESTAMENT_TASK
    from bert_tf.tasks.corpus_tasks import next_verse_pairs, read_chapters, split_chapters, squad_json, word_questions
    from bert_tf.tokenization import vocab_builder

    data = os.path.join(out, "data")
    os.makedirs(data, exist_ok=True)
    chapters = read_chapters(corpus, sizes["max_corpus_lines"])
    lines = [v for c in chapters for v in c]
    text_file = os.path.join(data, "corpus.txt")
    write_text_atomic(text_file, "\n\n".join("\n".join(c) for c in chapters) + "\n")
    vocab_file = os.path.join(data, "vocab.txt")
    vocab = vocab_builder.learn_wordpiece_vocab(vocab_builder.count_words(lines), vocab_size=sizes["vocab_size"])
    vocab_builder.write_vocab(vocab_file, vocab)
    records = os.path.join(data, "pretraining.tfrecord")
    pretraining_job.create_pretraining_data(pretraining_job.PretrainingDataConfig(
        input_file=text_file, output_file=records, vocab_file=vocab_file, max_seq_length=sizes["seq"],
        max_predictions_per_seq=sizes["predictions"], dupe_factor=sizes["dupe_factor"], random_seed=seed,
        num_workers=1))

    rng = random.Random(seed)
    train_chapters, dev_chapters = split_chapters(chapters)
    tasks = {}
    pair_dir = os.path.join(data, "nextverse")
    os.makedirs(pair_dir, exist_ok=True)
    for split, chs, n in (("train", train_chapters, sizes["pair_train"]), ("dev", dev_chapters, sizes["pair_dev"])):
        write_tsv(os.path.join(pair_dir, f"{split}.tsv"), ("sentence_a", "sentence_b", "label"),
                  next_verse_pairs(chs, n, rng))
    tasks["nextverse"] = pair_dir
    span_dir = os.path.join(data, "wordspan")
    os.makedirs(span_dir, exist_ok=True)
    kinds = {}
    for split, chs, n in (("train", train_chapters, sizes["span_train"]), ("dev", dev_chapters, sizes["span_dev"])):
        questions = word_questions(chs, n, rng)
        write_text_atomic(os.path.join(span_dir, f"{split}.json"), json.dumps(squad_json(questions)))
        if split == "dev":
            kinds = {q[0]: (q[5], q[3]) for q in questions}
    tasks["wordspan"] = span_dir
    tasks["testament"] = TESTAMENT_TASK
    if sizes["testament_train"]:  # quick mode: a slice of the bundled task
        small = os.path.join(data, "testament")
        os.makedirs(small, exist_ok=True)
        for split, n in (("train", sizes["testament_train"]), ("dev", sizes["pair_dev"])):
            with open(os.path.join(TESTAMENT_TASK, f"{split}.tsv"), encoding="utf-8") as f:
                rows = f.read().splitlines()
            write_text_atomic(os.path.join(small, f"{split}.tsv"), "\n".join(rows[:n + 1]) + "\n")
        tasks["testament"] = small
    return dict(vocab_file=vocab_file, vocab_size=len(vocab), records=records, tasks=tasks, span_kinds=kinds,
                corpus_lines=len(lines), chapters=len(chapters))


def pretrain(out, objective, data, sizes, seed, strategy):
    from bert_tf.configs import BertConfig
    from bert_tf.runners.pretraining import run_pretraining
    from bert_tf.runners.pretraining_config import PretrainingConfig
    from bert_tf.training.settings import TrainSettings

    config = BertConfig(vocab_size=data["vocab_size"], hidden_size=sizes["hidden_size"],
                        num_hidden_layers=sizes["num_layers"], num_attention_heads=sizes["num_heads"],
                        intermediate_size=4 * sizes["hidden_size"], max_position_embeddings=max(64, sizes["seq"]),
                        type_vocab_size=2)
    steps = sizes["pretrain_steps"]
    every = max(1, steps // sizes["num_checkpoints"])
    model_dir = os.path.join(out, "pretrained", objective)
    results = run_pretraining(PretrainingConfig(
        bert_config=config, input_files=[data["records"]], output_dir=model_dir, max_seq_length=sizes["seq"],
        max_predictions_per_seq=sizes["predictions"], do_train=True, do_eval=True,
        train_batch_size=sizes["pretrain_batch"], eval_batch_size=64, num_train_steps=steps,
        num_warmup_steps=max(1, steps // 15), max_eval_steps=20, vocab_file=data["vocab_file"],
        train=TrainSettings(learning_rate=sizes["pretrain_lr"], save_checkpoints_steps=every,
                            iterations_per_loop=every, keep_checkpoint_max=100, seed=seed),
        do_lower_case=True, objective=objective), strategy)
    # Evenly spaced, the last one the end of training (2000 / 3: 666, 1332, 2000, not also 1998).
    checkpoints = sorted({*(every * (i + 1) for i in range(sizes["num_checkpoints"] - 1)), steps})
    return model_dir, config, checkpoints, results


def finetune(task, out_dir, pretrained, data, sizes, seed, strategy):
    """Fine-tunes one model on one task; returns {metric: value}."""
    from bert_tf.runners import classifier, squad
    from bert_tf.runners.settings import RunSettings
    from bert_tf.tasks import glue
    from bert_tf.training.settings import TrainSettings

    settings = RunSettings(pretrained=pretrained, strategy=strategy,
                           train=TrainSettings(learning_rate=sizes["finetune_lr"], iterations_per_loop=50,
                                               save_checkpoints_steps=100000, keep_checkpoint_max=1, seed=seed))
    common = dict(output_dir=out_dir, run=settings, max_seq_length=sizes["seq"], do_lower_case=True,
                  train_batch_size=sizes["finetune_batch"], num_train_epochs=sizes["finetune_epochs"])
    if task == "wordspan":
        results = squad.run(squad.SquadRunConfig(
            train_file=os.path.join(data["tasks"][task], "train.json"),
            predict_file=os.path.join(data["tasks"][task], "dev.json"), do_train=True, do_eval=True,
            predict_batch_size=64, eval_batch_size=64, max_query_length=16, doc_stride=32, **common))["dev"]
        with open(os.path.join(out_dir, "predictions.json"), encoding="utf-8") as f:
            predictions = json.load(f)
        for kind in ("after", "before"):
            ids = [q for q, (k, _) in data["span_kinds"].items() if k == kind]
            hits = [predictions.get(q, "").strip(" .,;:").lower() == data["span_kinds"][q][1].lower() for q in ids]
            results[f"exact_match_{kind}"] = 100.0 * sum(hits) / max(1, len(hits))
        return results
    if task == "testament":
        spec = glue.user_task("sentence", "label", index="id", name="testament")
    else:
        spec = glue.user_task("sentence_a", "label", "sentence_b", name="nextverse")
    spec = glue.infer_labels(spec, data["tasks"][task]) if not spec.labels else spec
    results = classifier.run(classifier.ClassifierRunConfig(
        task=spec, data_dir=data["tasks"][task], do_train=True, do_eval=True, eval_batch_size=64, **common))
    return results["dev"]


def write_csv(out, rows):
    """results.csv: one row per (objective, pretraining step, task, metric); rewritten after every run."""
    fields = ["objective", "pretrain_step", "task", "metric", "value"]
    csv_tmp = os.path.join(out, f".results.csv.tmp-{os.getpid()}")
    with open(csv_tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(csv_tmp, os.path.join(out, "results.csv"))


def write_outputs(out, rows, pretraining_results, info):
    """results.csv (all runs), results.md (final checkpoints) and the Figure-5 plot."""
    from bert_tf.fileio import write_text_atomic

    write_csv(out, rows)

    def value(objective, step, task, metric):
        for r in rows:
            if (r["objective"], r["pretrain_step"], r["task"], r["metric"]) == (objective, step, task, metric):
                return r["value"]
        return None

    objectives = [o for o in dict.fromkeys(r["objective"] for r in rows)]
    columns = []
    for task in dict.fromkeys(r["task"] for r in rows):
        columns.append((task, TASK_METRICS[task]))
        if task == "wordspan":
            columns += [(task, "exact_match_after"), (task, "exact_match_before")]
    header = ["objective", "pretraining steps", "pretraining eval"] + [f"{t} {m.replace('eval_', '')}"
                                                                        for t, m in columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for objective in objectives:
        step = max(r["pretrain_step"] for r in rows if r["objective"] == objective)
        pre = pretraining_results.get(objective, {})
        pre_text = ", ".join(f"{k} {pre[k]:.3f}" for k in ("masked_lm_accuracy", "next_sentence_accuracy",
                                                           "lm_accuracy") if k in pre) or "-"
        cells = [objective, str(step), pre_text]
        for task, metric in columns:
            v = value(objective, step, task, metric)
            cells.append("-" if v is None else f"{v:.1f}" if metric.startswith("exact") else f"{100 * v:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    text = (f"# Pretraining ablations in miniature\n\n{info}\n\nDev metrics (accuracy or exact match, %) after "
            f"fine-tuning from each objective's last checkpoint; `{NO_PRETRAINING}` = random initialisation.\n\n"
            + "\n".join(lines) + "\n")
    write_text_atomic(os.path.join(out, "results.md"), text)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in rows))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        metric = TASK_METRICS[task]
        base = value(NO_PRETRAINING, 0, task, metric)
        for objective in objectives:
            if objective == NO_PRETRAINING:
                continue
            points = sorted((r["pretrain_step"], r["value"]) for r in rows
                            if r["objective"] == objective and r["task"] == task and r["metric"] == metric)
            if base is not None:
                points = [(0, base)] + points
            scale = 1.0 if metric.startswith("exact") else 100.0
            ax.plot([p[0] for p in points], [scale * p[1] for p in points], marker="o", label=objective)
        ax.set_title(f"{task} ({metric.replace('eval_', '')})")
        ax.set_xlabel("pretraining steps")
        ax.set_ylabel("dev %")
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.tight_layout()
    png_tmp = os.path.join(out, f".plot.tmp-{os.getpid()}.png")
    fig.savefig(png_tmp, dpi=110)
    os.replace(png_tmp, os.path.join(out, "dev_vs_pretraining_steps.png"))
    return text


def main(_):
    try:  # the plot comes last; fail before an hour of training, not after it
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("error: experiments/ablations.py needs matplotlib for its plot: pip install -e .[experiments]")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S", force=True)
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    for name in ("bert_tf.training", "bert_tf.pretrained", "bert_tf.classifier", "bert_tf.squad",
                 "bert_tf.runners", "bert_tf.pretraining", "bert_tf.data"):
        logging.getLogger(name).setLevel(logging.WARNING)  # one line per run from here instead
    from bert_tf.pretrained import resolve_pretrained
    from bert_tf.resources import SAMPLE_CORPUS
    from bert_tf.runners.pretraining_config import OBJECTIVES
    from bert_tf.training.strategy import get_strategy

    sizes = dict(QUICK if FLAGS.quick else FULL)
    if FLAGS.pretrain_steps:
        sizes["pretrain_steps"] = FLAGS.pretrain_steps
    if FLAGS.num_checkpoints:
        sizes["num_checkpoints"] = FLAGS.num_checkpoints
    bad = [o for o in FLAGS.objectives if o not in OBJECTIVES] + [t for t in FLAGS.tasks if t not in TASK_METRICS]
    if bad:
        sys.exit(f"error: unknown objective/task {', '.join(bad)}; objectives {', '.join(OBJECTIVES)}, "
                 f"tasks {', '.join(TASK_METRICS)}")
    shared = os.path.join(os.path.dirname(REPO), "shared", "corpora", "kjv_pretraining.txt")
    corpus = FLAGS.corpus or (shared if os.path.exists(shared) else SAMPLE_CORPUS)
    if not os.path.exists(corpus):
        sys.exit(f"error: {corpus}: corpus not found")
    out = os.path.abspath(FLAGS.output_dir)
    os.makedirs(out, exist_ok=True)
    started = time.time()
    strategy = get_strategy("one_device")

    data = build_data(out, corpus, sizes, FLAGS.seed)
    logger.info("data: %d verses in %d chapters of %s, vocab %d (%.0fs)", data["corpus_lines"], data["chapters"],
                corpus, data["vocab_size"], time.time() - started)

    rows, pretraining_results = [], {}

    def record(objective, step, task, results):
        for metric, v in results.items():
            if metric == TASK_METRICS[task] or metric.startswith("exact_match") or metric == "f1":
                rows.append(dict(objective=objective, pretrain_step=step, task=task, metric=metric, value=float(v)))
        write_csv(out, rows)  # partial results survive an interrupted run
        logger.info("%-8s step %5d %-10s %s (%.0fs elapsed)", objective, step, task,
                    f"{TASK_METRICS[task]} {results[TASK_METRICS[task]]:.4f}", time.time() - started)

    base_config = None
    for objective in FLAGS.objectives:
        t0 = time.time()
        model_dir, config, checkpoints, results = pretrain(out, objective, data, sizes, FLAGS.seed, strategy)
        base_config = config
        pretraining_results[objective] = results
        logger.info("pretrained %s: %d steps in %.0fs: %s", objective, sizes["pretrain_steps"], time.time() - t0,
                    " ".join(f"{k} {v:.3f}" for k, v in sorted(results.items()) if k != "global_step"))
        for step in checkpoints:
            pretrained = resolve_pretrained(os.path.join(model_dir, f"ckpt-{step}"))
            for task in FLAGS.tasks:
                out_dir = os.path.join(out, "finetuned", f"{objective}_{step}_{task}")
                record(objective, step, task, finetune(task, out_dir, pretrained, data, sizes, FLAGS.seed, strategy))
    # No pretraining: the same model from random initialisation (bidirectional).
    from bert_tf.pretrained import Pretrained

    scratch = Pretrained(base_config, data["vocab_file"], None, None, True)
    for task in FLAGS.tasks:
        out_dir = os.path.join(out, "finetuned", f"{NO_PRETRAINING}_{task}")
        record(NO_PRETRAINING, 0, task, finetune(task, out_dir, scratch, data, sizes, FLAGS.seed, strategy))

    elapsed = time.time() - started
    info = (f"`python experiments/ablations.py{' --quick' if FLAGS.quick else ''}`: corpus {os.path.basename(corpus)} "
            f"({data['corpus_lines']} verses), L{sizes['num_layers']}/H{sizes['hidden_size']}, seq {sizes['seq']}, "
            f"{sizes['pretrain_steps']} pretraining steps of {sizes['pretrain_batch']} per objective, "
            f"fine-tuning {sizes['finetune_epochs']:g} epochs at lr {sizes['finetune_lr']:g}, one seed; "
            f"{elapsed / 60:.1f} min in all.")
    text = write_outputs(out, rows, pretraining_results, info)
    print(text)
    print(f"wrote {os.path.join(out, 'results.csv')}, results.md, dev_vs_pretraining_steps.png")


if __name__ == "__main__":
    app.run(main)
