"""Follows the pretraining config through a tiny run_pretraining.py run: the files it passes from the script to
the compiled step, and how often the path climbs back up (docs/design.md, "The one path, room by room").

A call is on the config's path when one of its arguments (or `self`) is the run's PretrainingConfig or
TrainSettings, or when it returns one (alone or in a tuple); not a property read, nor the making of a config
(its __init__, __post_init__). The trace ends at the first call into bert_tf/training/step.py, the step XLA
compiles. The rooms are the files of those calls in call order, repeats in a row merged (a reader opens a
file when the config is handed into it). A climb back up is a move into a room already left, or into a
higher layer than the one left (tests/test_layers.py's table, lowest first; the top-level scripts above it).

  python benchmarks/config_path.py             # this checkout
  python benchmarks/config_path.py --repo=DIR  # another checkout (e.g. an older commit's `git archive`)

One CPU process, a 2-step run on a tiny model (~30 s). Not a speed benchmark.
"""

import argparse
import ast
import importlib.util
import inspect
import os
import sys
import tempfile

FOLLOWED = ("PretrainingConfig", "TrainSettings")


def layers_of(repo):
    """tests/test_layers.py's LAYERS of `repo`, read with ast (no import)."""
    with open(os.path.join(repo, "tests", "test_layers.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "LAYERS":
            return ast.literal_eval(node.value)
    raise SystemExit(f"error: no LAYERS in {repo}/tests/test_layers.py")


def layer(path, repo, layers):
    """The layer of a project file: the longest LAYERS prefix of its module; top-level scripts above all."""
    rel = os.path.relpath(path, repo)
    if os.sep not in rel:
        return len(layers)
    module = rel[:-3].replace(os.sep, ".").removesuffix(".__init__")
    best, found = -1, None
    for i, names in enumerate(layers):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, found = len(name), i
    return found


def followed(value):
    values = value if type(value) is tuple else (value,)  # type(): no attribute read on half-made objects
    return any(type(v).__name__ in FOLLOWED and type(v).__module__.startswith("bert_tf") for v in values)


def make_data(root):
    from bert_tf.configs import BertConfig
    from bert_tf.data import pretraining_job
    from bert_tf.resources import SAMPLE_CORPUS
    from bert_tf.tokenization import vocab_builder

    with open(SAMPLE_CORPUS, encoding="utf-8") as f:
        lines = f.read().splitlines()[:400]
    vocab = vocab_builder.learn_wordpiece_vocab(vocab_builder.count_words(lines), vocab_size=300, num_unused=0)
    vocab_builder.write_vocab(os.path.join(root, "vocab.txt"), vocab)
    corpus = os.path.join(root, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    pretraining_job.create_pretraining_data(pretraining_job.PretrainingDataConfig(
        input_file=corpus, output_file=os.path.join(root, "train.tfrecord"),
        vocab_file=os.path.join(root, "vocab.txt"), max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1,
        num_workers=1))
    BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=32, max_position_embeddings=32).to_json_file(os.path.join(root, "bert_config.json"))


def trace(repo, root):
    """[project file] of the calls on the config's path, in call order, up to the first call into step.py."""
    spec = importlib.util.spec_from_file_location("run_pretraining", os.path.join(repo, "run_pretraining.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.FLAGS([
        "run_pretraining.py", f"--bert_config_file={root}/bert_config.json", f"--input_file={root}/train.tfrecord",
        f"--output_dir={root}/out", "--do_train", "--train_batch_size=8", "--num_train_steps=2",
        "--num_warmup_steps=0", "--iterations_per_loop=1", "--save_checkpoints_steps=2", "--max_seq_length=32",
        "--max_predictions_per_seq=5"])
    prefix, step_file = repo + os.sep, os.path.join(repo, "bert_tf", "training", "step.py")
    calls, events, stack, done = [], [], [], []  # calls: [file, on the path]

    def profile(frame, event, arg):
        code = frame.f_code
        # functions only (an import runs a module's and its classes' bodies too); no property reads
        if done or not code.co_filename.startswith(prefix) or not code.co_flags & inspect.CO_OPTIMIZED:
            return
        if event == "call":
            names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
            self = frame.f_locals.get("self") if names[:1] == ("self",) else None
            if self is not None and (isinstance(getattr(type(self), code.co_name, None), property)
                                     or code.co_name in ("__init__", "__post_init__") and followed(self)):
                return  # a property read, a config being made: not rooms (the config's own checks are)
            holds = code.co_name == "main" or any(followed(frame.f_locals.get(n)) for n in names)
            calls.append([code.co_filename, holds or code.co_filename == step_file, code.co_qualname])
            events.append(("call", len(calls) - 1))
            stack.append(len(calls) - 1)
            if code.co_filename == step_file:
                done.append(True)
        elif event == "return" and stack and calls[stack[-1]][0] == code.co_filename:
            index = stack.pop()
            calls[index][1] = calls[index][1] or followed(arg)
            events.append(("return", index))

    sys.setprofile(profile)
    try:
        script.main([])
    except SystemExit as e:
        if e.code:
            raise
    finally:
        sys.setprofile(None)
    if not done:
        raise SystemExit("error: the run never reached bert_tf/training/step.py")
    # A reader opens each file in call order; a return is going back to a file already open.
    return [(calls[index][0], calls[index][2]) for kind, index in events if kind == "call" and calls[index][1]]


def rooms_and_climbs(calls, repo, layers):
    """(rooms: (file, its functions called in a row) with repeats in a row merged, the indices of the rooms
    entered by a climb back up)."""
    rooms = []
    for path, name in calls:
        if rooms and rooms[-1][0] == path:
            rooms[-1][1].append(name)
        else:
            rooms.append((path, [name]))
    files = [path for path, _ in rooms]
    climbs = [i for i in range(1, len(files))
              if files[i] in files[:i] or layer(files[i], repo, layers) > layer(files[i - 1], repo, layers)]
    return rooms, climbs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args()
    repo = os.path.realpath(args.repo)
    sys.path.insert(0, repo)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    layers = layers_of(repo)
    with tempfile.TemporaryDirectory() as root:
        make_data(root)
        calls = trace(repo, root)
    rooms, climbs = rooms_and_climbs(calls, repo, layers)
    print(f"{len({path for path, _ in rooms})} files, {len(rooms)} rooms entered, {len(climbs)} climbs back up")
    for i, (path, names) in enumerate(rooms):
        names = ", ".join(dict.fromkeys(names))
        print(f"  {i:2d} layer {layer(path, repo, layers)}  {os.path.relpath(path, repo)} ({names}){'  ^ climb' * (i in climbs)}")

if __name__ == "__main__":
    main()
