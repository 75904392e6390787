"""What the long-input tests share (tests/test_long_inputs_*.py): the tiny task's sizes and words, and a
classifier run through run_classifier's library."""

from conftest import tiny_run_settings

from bert_tf.tasks import glue

TINY_CONFIG_OVERRIDES = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # conftest's tiny_model, no dropout
SEQ = 16  # max_seq_length of these tests: 14 pieces of a single text per window
FILLER = ["the", "a", "dog", "sat", "on", "mat", "how", "are", "you", "hello", "low", "."]  # one piece each


def _settings(tiny_model, learning_rate=1e-3):
    return tiny_run_settings(tiny_model, learning_rate=learning_rate, iterations_per_loop=50,
                             save_checkpoints_steps=1000)


def _write_split(path, rows, with_label=True):
    header = "id\ttext\tlabel" if with_label else "id\ttext"
    lines = [header] + [f"{i}\t{text}\t{label}" if with_label else f"{i}\t{text}" for i, (text, label) in
                        enumerate(rows)]
    path.write_text("\n".join(lines) + "\n")


def _run(tiny_model, data_dir, out, learning_rate=1e-3, labels=("no", "yes"), **kw):
    """run_classifier's library on a user task (labels: () reads them from train.tsv, as without --labels)."""
    from bert_tf.runners.classifier import ClassifierRunConfig, run

    task = glue.user_task("text", "label", labels=list(labels), index="id")
    cfg = ClassifierRunConfig(task=task, data_dir=str(data_dir), output_dir=str(out),
                              run=_settings(tiny_model, learning_rate),
                              max_seq_length=SEQ, train_batch_size=16, eval_batch_size=8, predict_batch_size=8,
                              **kw)
    return run(cfg)


MARKER = ["want", "cat", "!"]  # the sentence "want cat !": none of its pieces is a filler word


def _doc(rng, pieces, marker_at=None):
    """`pieces` random filler words; MARKER in place of the words from `marker_at` on (clipped to the end)."""
    words = list(rng.choice(FILLER, size=pieces))
    if marker_at is not None:
        marker_at = min(marker_at, pieces - len(MARKER))
        words[marker_at:marker_at + len(MARKER)] = MARKER
    return " ".join(words)


ROOM = SEQ - 2  # pieces of a single text per window


def _long_task_split(rng, n):
    """n balanced documents of three windows; "yes" ones hold MARKER somewhere after their first window."""
    labels = rng.permutation([i % 2 for i in range(n)])
    return [(_doc(rng, 3 * ROOM, int(rng.integers(ROOM, 3 * ROOM)) if y else None), "yes" if y else "no")
            for y in labels]
