"""How long each script takes to refuse a bad setting: the gate before TensorFlow (bert_flags.py).

Fresh processes, --runs of each (default 5), the median wall time printed as a table, with two peers
for scale: `python -c pass` and `python -c "import tensorflow"`. Each script is given one setting no
run can use (tests/test_gate.py checks the same ones end to end), in an empty temporary folder; a
row whose script exits 0 or writes anything is marked.

  python benchmarks/bench_startup.py            # 5 runs each
  python benchmarks/bench_startup.py --runs=1   # a quick check that every row runs
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (row name, command after the interpreter): one bad setting per script.
CASES = [
    ("python -c pass", ["-c", "pass"]),
    ("python -c 'import tensorflow'", ["-c", "import tensorflow"]),
    ("run_classifier.py", ["run_classifier.py", "--task_name=user", "--data_dir=.", "--output_dir=o",
                           "--learning_rate=-1e-5"]),
    ("run_ner.py", ["run_ner.py", "--data_dir=.", "--output_dir=o", "--dynamic_padding", "--pack_sequences"]),
    ("run_swag.py", ["run_swag.py", "--data_dir=.", "--output_dir=o", "--iterations_per_loop=0"]),
    ("run_squad.py", ["run_squad.py", "--output_dir=o", "--do_train", "--learning_rate=0"]),
    ("run_pretraining.py", ["run_pretraining.py", "--input_file=x", "--output_dir=o", "--init_checkpoint=x",
                            "--do_train", "--num_warmup_steps=-1"]),
    ("create_pretraining_data.py", ["create_pretraining_data.py", "--input_file=x", "--output_file=y",
                                    "--vocab_file=v", "--masking=dynamic", "--dupe_factor=5"]),
    ("create_vocab.py", ["create_vocab.py", "--input_file=x", "--vocab_file=v", "--vocab_size=3"]),
    ("create_bert_config.py", ["create_bert_config.py", "--size=base", "--vocab_file=/nonexistent/vocab.txt"]),
    ("export_savedmodel.py", ["export_savedmodel.py", "--export_dir=e"]),
    ("extract_features.py", ["extract_features.py", "--input_file=x", "--output_file=y", "--init_checkpoint=c",
                             "--layers=a"]),
    ("predict.py", ["predict.py", "--export_dir=e"]),
    ("convert_checkpoint.py", ["convert_checkpoint.py", "--input_checkpoint=x"]),
]


def time_once(args):
    """(seconds, exit code, wrote something) of one fresh process in an empty folder."""
    with tempfile.TemporaryDirectory() as folder:
        argv = [sys.executable] + [os.path.join(REPO, a) if a.endswith(".py") else a for a in args]
        env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
        start = time.perf_counter()
        code = subprocess.run(argv, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
        return time.perf_counter() - start, code, bool(os.listdir(folder))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per row (the median is printed)")
    args = parser.parse_args(argv)
    print(f"{'command':<32} {'median s':>9} {'min s':>7}  note")
    for name, command in CASES:
        times, notes = [], set()
        for _ in range(args.runs):
            seconds, code, wrote = time_once(command)
            times.append(seconds)
            if name.endswith(".py") and code == 0:
                notes.add("exit 0: not refused")
            if wrote:
                notes.add("wrote files")
        print(f"{name:<32} {statistics.median(times):>9.2f} {min(times):>7.2f}  {', '.join(sorted(notes))}")


if __name__ == "__main__":
    main()
