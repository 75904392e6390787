"""What a checkpoint holds and how a run finds its place again (docs/reliability.md).

`Checkpoints` owns a Trainer's checkpoint items (model, optimizer slots and step, dropout seed
states, float16 loss scale) and the input signature saved beside them, and does the three things
the Trainer asks of checkpoints:
  * restore: the newest complete checkpoint of model_dir, falling back to older ones past damaged
    files, with one-line errors when none fits;
  * save: one checkpoint, removing the partial files of a failed write;
  * resume_input: the training iterator positioned where the restored checkpoint's input stopped
    (its saved tf.data position, or the consumed batches skipped, or the start of another input).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Callable, Optional

import tensorflow as tf

from bert_tf import model_dir as model_dir_lib
from bert_tf.errors import TrainingError
from bert_tf.training.errors import first_line

logger = logging.getLogger("bert_tf.training")


class Checkpoints:
    """A Trainer's checkpoints in model_dir.

    Args:
      items: {name: trackable} saved in every checkpoint (model, optimizer, ...).
      model_dir: where they live (a non-chief worker writes a temporary copy it then deletes).
      strategy: the run's strategy (multi-worker: every worker takes part in a save).
      is_chief: whether this process keeps what it writes.
      keep_max: checkpoints kept.
      checkpoint_input_pipeline: save the input position too (one device only: tf.distribute's
        iterators cannot be saved).
    """

    def __init__(self, items: dict, model_dir: str, strategy, *, is_chief: bool, keep_max: int,
                 checkpoint_input_pipeline: bool):
        self.items = items
        self.model_dir = model_dir
        self.strategy = strategy
        self.is_chief = is_chief
        self.keep_max = keep_max
        self.checkpoint_input_pipeline = checkpoint_input_pipeline
        # What input the checkpoints' position belongs to (input_signature): a resumed run with
        # other records (phase 2 of pretraining at another seq length, other files, batch size or
        # packing) starts its input from the beginning instead of restoring another pipeline's state.
        with tf.device("/cpu:0"):
            self.input_signature = tf.Variable("", dtype=tf.string, trainable=False, name="input_signature")

    def manager(self, iterator=None):
        items = dict(self.items, input_signature=self.input_signature)
        if iterator is not None:
            items["train_iterator"] = iterator
        checkpoint = tf.train.Checkpoint(**items)
        directory = self.model_dir
        if not self.is_chief:
            # Every worker must take part in the save; only the chief's copy is kept.
            task = self.strategy.cluster_resolver.task_id
            directory = os.path.join(directory, f".worker_{task}_tmp")
        return tf.train.CheckpointManager(checkpoint, directory, max_to_keep=self.keep_max)

    def restore(self, global_step) -> Optional[str]:
        """Restores the newest complete checkpoint of model_dir (the items and the input signature it was
        trained on; the input position is resume_input's business). Returns its path, None when there is none.

        A checkpoint that cannot be read (cut short by a kill or a full disk, a file missing, the
        state file naming a checkpoint that is gone) is skipped with a warning and the next older
        one is tried, so a run never resumes from a damaged checkpoint nor silently starts over.
        Raises TrainingError when checkpoints exist but none can be restored, saying whether
        their files are missing, unreadable, or belong to another model (the first variable that
        differs, with both shapes)."""
        checkpoint = tf.train.Checkpoint(**self.items)
        self.input_signature.assign("")
        if self.is_chief:
            leftovers = model_dir_lib.remove_partial_saves(self.model_dir)
            if leftovers:
                logger.info("removed %d partial checkpoint save(s) of a killed run: %s", len(leftovers),
                            ", ".join(os.path.basename(p) for p in leftovers))
        problems = []
        for path in model_dir_lib.checkpoint_candidates(self.model_dir):
            try:
                status = checkpoint.restore(path)
                status.assert_existing_objects_matched().expect_partial()  # (input position: resume_input)
                # Written since the input signature exists; an older checkpoint leaves it "" (unknown).
                tf.train.Checkpoint(input_signature=self.input_signature).read(path).expect_partial()
            except (tf.errors.OpError, ValueError, IndexError, AssertionError) as e:
                kind, detail = model_dir_lib.describe_restore_error(e)
                problems.append((kind, f"{os.path.basename(path)}: {kind}: {detail}"))
                logger.warning("cannot restore %s (%s: %s); trying an older checkpoint", path, kind, detail)
                continue
            logger.info("resumed from %s at step %d", path, int(global_step.numpy()))
            return path
        if problems:
            if {kind for kind, _ in problems} == {model_dir_lib.RESTORE_MISMATCH}:
                what, advice = " into this model", "; use another output_dir for a different model"
            else:
                what, advice = "", "; check that its files are complete and readable, or move the damaged ones away"
            raise TrainingError(
                f"{self.model_dir}: none of its {len(problems)} checkpoint(s) can be restored{what} "
                f"({problems[0][1]}){advice}"
            )
        return None

    def save(self, manager, step: int) -> Optional[str]:
        """Saves checkpoint `step` through `manager`; TrainingError (partial files removed) when it fails."""
        try:
            path = manager.save(checkpoint_number=step)
        except (tf.errors.OpError, OSError) as e:
            # Disk full, quota, permissions: remove what was written of this step's checkpoint so nothing
            # half-written sits beside the complete checkpoints (the state file still names those).
            prefix = model_dir_lib.checkpoint_prefix(manager.directory, step)
            for leftover in tf.io.gfile.glob(prefix + ".*") + tf.io.gfile.glob(prefix + "_temp*"):
                with contextlib.suppress(tf.errors.OpError, OSError):
                    if tf.io.gfile.isdir(leftover):
                        tf.io.gfile.rmtree(leftover)
                    else:
                        tf.io.gfile.remove(leftover)
            raise TrainingError(
                f"{manager.directory}: cannot write checkpoint {os.path.basename(prefix)} ({first_line(e)}); "
                f"earlier checkpoints are intact (latest: {manager.latest_checkpoint or 'none'})"
            ) from None
        if not self.is_chief:
            tf.io.gfile.rmtree(manager.directory)
            return None
        logger.info("saved checkpoint %s", path)
        return path

    # ------------------------------------------------------------------ input position
    def can_checkpoint_iterator(self) -> bool:
        return self.checkpoint_input_pipeline and isinstance(self.strategy, tf.distribute.OneDeviceStrategy)

    def resume_input(self, distribute: Callable, dataset_fn, per_replica: int, micro_batches: int, signature: str,
                     restored: Optional[str], step: int, live=None, steps_per_element: int = 1):
        """(iterator, checkpoint manager) for train(), positioned where the restored checkpoint's input
        stopped (docs/reliability.md, rule 3):
        - the same input in the same process: the iterator the last train() call left (`live`:
          (dataset_fn, signature, iterator, step) of that call);
        - the same input after a restart: one device restores the saved tf.data position; strategies
          whose iterators cannot be saved (Mirrored, MultiWorker, TPU) skip the batches the restored
          step consumed, so with a seed the batches follow on exactly and no example comes twice early;
        - another input (two-phase pretraining: seq 128 then 512): weights, optimizer and step resume,
          the new input starts at its beginning; one log line says which of these happened.
        distribute(dataset_fn, per_replica, micro_batches, skip_batches=0, steps_per_element=1) makes the input
        (Trainer.distribute); steps_per_element: steps per element of the iterator (a K-step program's stack)."""
        old_signature = self.input_signature.numpy().decode("utf-8")
        self.input_signature.assign(signature)
        checkpointable = self.can_checkpoint_iterator()
        if live is not None and live[0] is dataset_fn and live[1] == signature and live[3] == step:
            return live[2], self.manager(live[2] if checkpointable else None)
        same_input = restored is not None and old_signature == signature
        skip = 0
        if same_input and not checkpointable:
            skip = step * micro_batches * max(1, self.strategy.num_replicas_in_sync //
                                              max(1, self.num_input_pipelines()))
        iterator = iter(distribute(dataset_fn, per_replica, micro_batches, skip_batches=skip,
                                   steps_per_element=steps_per_element))
        manager = self.manager(iterator if checkpointable else None)
        if restored is None:
            return iterator, manager
        if not same_input:
            logger.info("the input differs from the one %s was trained on (%s); weights, optimizer and step %d "
                        "resume, the input starts from its beginning", os.path.basename(restored),
                        signature_change(old_signature, signature), step)
        elif checkpointable:
            try:
                status = tf.train.Checkpoint(train_iterator=iterator).read(restored)
                status.assert_existing_objects_matched()
                logger.info("input position restored from %s", os.path.basename(restored))
            except (AssertionError, ValueError, tf.errors.OpError) as e:
                # Saved under a strategy that cannot save its iterator, or by a pipeline of another
                # definition: move this one past what the step consumed. (Advanced in place, not with
                # Dataset.skip, so the definition, and so the next save's position, stays restorable.)
                logger.info("input position of %s not restored (%s)", os.path.basename(restored), first_line(e)[:160])
                iterator = iter(distribute(dataset_fn, per_replica, micro_batches, steps_per_element=steps_per_element))
                manager = self.manager(iterator)
                skip = step * micro_batches
        if skip:
            logger.info("input position: skipping the %d batch(es) per input pipeline consumed by step %d "
                        "(reads them once, trains on none)", skip, step)
            if checkpointable:  # (its elements group micro_batches x steps_per_element batches)
                advance(iterator, skip // (micro_batches * steps_per_element))
        return iterator, manager

    def num_input_pipelines(self) -> int:
        resolver = getattr(self.strategy, "cluster_resolver", None)
        if isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy) and resolver is not None:
            return max(1, len(resolver.cluster_spec().as_dict().get("worker", [])))
        return 1


@tf.function(autograph=False)
def _advance_loop(iterator, n):
    def body(i):
        next(iterator)
        return i + 1

    return tf.while_loop(lambda i: i < n, body, [tf.constant(0, tf.int64)])


def advance(iterator, n: int) -> None:
    """Draws and drops n elements of a tf.data iterator (one host call)."""
    if n:
        _advance_loop(iterator, tf.constant(n, tf.int64))


def input_signature(element_spec, per_replica_batch: int, micro_batches: int, replicas: int, input_id: str) -> str:
    """What identifies a training input for resuming its position: the data (input_id, e.g. its files),
    the batch shapes and dtypes (seq length, predictions per sequence, packing) and how it is split."""
    shapes = {}

    def visit(spec, path):
        if isinstance(spec, dict):
            for key in sorted(spec):
                visit(spec[key], f"{path}/{key}" if path else str(key))
        elif isinstance(spec, (tuple, list)):
            for i, item in enumerate(spec):
                visit(item, f"{path}/{i}" if path else str(i))
        else:
            shapes[path] = (spec.dtype.name, spec.shape.as_list())

    visit(element_spec, "")
    return json.dumps(dict(data=input_id, batch=per_replica_batch, micro_batches=micro_batches, replicas=replicas,
                           features=shapes), sort_keys=True)


def signature_change(old: str, new: str) -> str:
    """The keys in which two input signatures differ, for the resume log line."""
    if not old:
        return "the checkpoint predates input signatures"
    try:
        a, b = json.loads(old), json.loads(new)
    except json.JSONDecodeError:
        return "unreadable signature"
    changed = [k for k in sorted(b) if a.get(k) != b[k]]
    if "features" in changed:
        fa, fb = a.get("features", {}), b["features"]
        diffs = [f"{k} {fa.get(k, [None, None])[1]} -> {fb[k][1]}" for k in sorted(fb) if fa.get(k) != fb[k]]
        changed[changed.index("features")] = "shapes: " + ", ".join(diffs[:3])
    return "; ".join(changed)
