"""Builds the quickstart's sentence classification task from the King James Bible (public domain).

Label: does a verse come from the Old or the New Testament? Style and names give
it away often but not always, so a pretrained model has room to beat a tiny one.
Usage: python scripts/make_testament_task.py ../shared/corpora/kjv.txt bert_tf/resources/testament
"""

import os
import random
import sys

SIZES = {"train": 1600, "dev": 400, "test": 200}
FIRST_NEW_TESTAMENT_BOOK = "Mat"


def main(kjv_path, out_dir, seed=20261122):
    old, new = [], []
    target = old
    with open(kjv_path, encoding="utf-8") as f:
        for line in f:
            ref, _, text = line.strip().partition(" ")
            if ref.startswith(FIRST_NEW_TESTAMENT_BOOK + "1:"):
                target = new
            text = text.replace("\t", " ").strip()
            if 20 <= len(text) <= 200:
                target.append(text)
    rng = random.Random(seed)
    rng.shuffle(old)
    rng.shuffle(new)
    os.makedirs(out_dir, exist_ok=True)
    for split, size in SIZES.items():
        rows = [(t, "old") for t in old[: size // 2]] + [(t, "new") for t in new[: size // 2]]
        del old[: size // 2], new[: size // 2]
        rng.shuffle(rows)
        with open(os.path.join(out_dir, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("id\tsentence\tlabel\n" if split != "test" else "id\tsentence\n")
            for i, (text, label) in enumerate(rows):
                f.write(f"{i}\t{text}\t{label}\n" if split != "test" else f"{i}\t{text}\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
