"""Builds the `tf.distribute` strategy named by one flag (docs/design.md, "Distribution").

  one_device    the first GPU if there is one, else the CPU
  mirrored      all local GPUs (or the logical CPU devices a test configured)
  multi_worker  MultiWorkerMirroredStrategy; the cluster comes from TF_CONFIG
  tpu           TPUStrategy on the TPU named by `tpu` (name, grpc:// address or "local")

Every failure is a `ConfigError` with one line that says what to fix.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import tensorflow as tf

from bert_tf.errors import ConfigError

STRATEGIES = ("one_device", "mirrored", "multi_worker", "tpu")


StrategyError = ConfigError  # the old name, kept importable (bert_tf/errors.py: what can go wrong)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 300 else text[:297] + "..."


def get_strategy(
    name: str,
    tpu: Optional[str] = None,
    tpu_zone: Optional[str] = None,
    gcp_project: Optional[str] = None,
) -> tf.distribute.Strategy:
    """Returns the strategy for `name` (one of STRATEGIES).

    Call it before any other TensorFlow op runs: the TPU and multi-worker
    strategies must initialise the runtime themselves.
    """
    if name not in STRATEGIES:
        raise ConfigError(f"unknown distribution_strategy {name!r}; expected one of {', '.join(STRATEGIES)}")
    if name == "one_device":
        gpus = tf.config.list_logical_devices("GPU")
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in gpus] or [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices)
    if name == "multi_worker":
        return _multi_worker()
    return _tpu(tpu, tpu_zone, gcp_project)


def _multi_worker() -> tf.distribute.Strategy:
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise ConfigError(
            "distribution_strategy=multi_worker needs TF_CONFIG, e.g. "
            '{"cluster": {"worker": ["host1:port", "host2:port"]}, "task": {"type": "worker", "index": 0}}'
        )
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(config, dict) or "cluster" not in config or "task" not in config:
        raise ConfigError('TF_CONFIG must have "cluster" and "task" entries')
    task = config["task"]
    workers = config["cluster"].get("worker", []) + config["cluster"].get("chief", [])
    if not workers:
        raise ConfigError('TF_CONFIG: cluster has no "worker" (or "chief") addresses')
    if task.get("type") not in ("worker", "chief") or not isinstance(task.get("index"), int):
        raise ConfigError(f'TF_CONFIG: task must be {{"type": "worker"|"chief", "index": int}}, got {task}')
    try:
        return tf.distribute.MultiWorkerMirroredStrategy()
    except (ValueError, RuntimeError, tf.errors.OpError) as e:
        raise ConfigError(f"cannot start MultiWorkerMirroredStrategy: {_one_line(e)}") from None


def _tpu(tpu: Optional[str], zone: Optional[str], project: Optional[str]) -> tf.distribute.Strategy:
    if not tpu:
        raise ConfigError(
            "distribution_strategy=tpu needs --tpu_name (a Cloud TPU name, a grpc:// address, or 'local' on a TPU VM)"
        )
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu="" if tpu == "local" else tpu, zone=zone, project=project
        )
        if tpu != "local":
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except Exception as e:  # the resolver raises many types (ValueError, HttpError, NotFoundError, ...)
        raise ConfigError(f"cannot reach TPU {tpu!r}: {type(e).__name__}: {_one_line(e)}") from None
    return tf.distribute.TPUStrategy(resolver)


def describe(strategy: tf.distribute.Strategy) -> str:
    """`MirroredStrategy with 2 replicas` for the run summary."""
    return f"{type(strategy).__name__} with {strategy.num_replicas_in_sync} replica(s)"


def on_accelerator(strategy: tf.distribute.Strategy) -> bool:
    """Whether the strategy's replicas run on GPUs or TPUs (not the CPU)."""
    devices = [tf.DeviceSpec.from_string(d).device_type or "" for d in strategy.extended.worker_devices]
    return any(d.upper() in ("GPU", "TPU") for d in devices)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes summaries, logs and the real checkpoints."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True
    if resolver.task_type == "chief":
        return True
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return resolver.task_type == "worker" and resolver.task_id == 0 and not has_chief
