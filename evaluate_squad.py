"""The official SQuAD evaluation, v1.1 and v2.0, as one command with the official scripts' arguments.

  python evaluate_squad.py dev-v1.1.json predictions.json
      -> {"exact_match": ..., "f1": ...}
  python evaluate_squad.py --version 2.0 dev-v2.0.json predictions.json --na-prob-file null_odds.json
      -> exact, f1, total, HasAns_*, NoAns_*, best_exact, best_exact_thresh, best_f1, best_f1_thresh

The official scripts are argparse programs with positional files and dashed options
(`--na-prob-file`, `-o`), so this one is too: existing command lines keep working
after adding `--version 2.0`.
"""

import argparse
import json
import sys

from bert_tf.errors import InputDataError
from bert_tf.tasks import squad_metrics


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Official evaluation for SQuAD v1.1 and v2.0.")
    parser.add_argument("data_file", help="SQuAD dataset JSON (dev-v1.1.json / dev-v2.0.json).")
    parser.add_argument("pred_file", help="Predictions JSON {question id: answer text} (predictions.json).")
    parser.add_argument("--version", choices=("1.1", "2.0"), default="1.1", help="Which official script to follow.")
    parser.add_argument("--out-file", "-o", metavar="eval.json", help="v2.0: write the metrics here instead of stdout.")
    parser.add_argument(
        "--na-prob-file", "-n", metavar="na_prob.json", help="v2.0: no-answer probabilities per question (null_odds.json)."
    )
    parser.add_argument(
        "--na-prob-thresh",
        "-t",
        type=float,
        default=squad_metrics.DEFAULT_NA_PROB_THRESH,
        help="v2.0: predict no-answer when its probability is above this (default %(default)s).",
    )
    args = parser.parse_args(argv)
    if args.version == "1.1" and args.out_file:
        parser.error("--out-file is a SQuAD v2.0 option (use --version 2.0)")
    try:
        result = squad_metrics.evaluate_files(
            args.data_file, args.pred_file, args.version, args.na_prob_file, args.na_prob_thresh
        )
    except InputDataError as e:
        print(f"evaluate_squad.py: error: {e}", file=sys.stderr)
        return 1
    if args.version == "1.1":
        print(json.dumps(result))
    elif args.out_file:
        from bert_tf.fileio import write_text_atomic

        write_text_atomic(args.out_file, json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
