"""What can go wrong, in one list: every exception bert_tf raises on purpose, one class per concern.

How the scripts report them: the message of each is one line naming the problem (the file, the flag, the
value); a script prints it as `<script>: error: <message>` (bert_flags.fail: `error: <message>`) on
stderr and exits 1, and nothing in the output folder is damaged. Two exceptions to the exit code:
TrainingPreempted exits 143 (128 + SIGTERM) after its checkpoint, and OutOfDeviceMemory ends the process
at once after its line (bert_setup.fail_with). ONE_LINE_ERRORS is what the training scripts report so.

    BertError (ValueError)        what the user gave cannot be used
      ConfigError                 settings: flags, bert_config.json, strategy, casing, a run's set-up
      InputDataError              input data: text, TFRecords, task files, a vocab, a Beam job's inputs
      CheckpointError             checkpoints and model dirs
      ExportError                 export, serving options, ONNX, int8, predicting from an export
      OutputDirHeld               another live run holds output_dir
      RemotePathError (OSError)   a gs:// (or other remote) path that cannot be reached or read
    TrainingError (RuntimeError)  training cannot go on: NaN loss, checkpoint not written, lost worker
      OutOfDeviceMemory           a batch did not fit in the device's memory
    TrainingPreempted             SIGTERM: a checkpoint was saved; not a failure

The modules that raised their own classes before keep those names as aliases of these (e.g.
bert_tf.tokenization.VocabError is InputDataError), so code that imports or catches them keeps working.
This module imports nothing from bert_tf or TensorFlow (a script's gate may import it); the helpers that
make TensorFlow's errors into one line live in bert_tf/training/errors.py.
"""

from __future__ import annotations

from typing import Optional


class BertError(ValueError):
    """Something the user gave (a flag, a file, a folder) cannot be used; the message is one line.
    A ValueError, so code that catches ValueError (as the scripts do for argument checks) catches it."""


class ConfigError(BertError):
    """Settings that cannot work: a bert_config.json (or Hugging Face config.json) that cannot describe a
    BERT model, flags that do not go together, a distribution strategy that cannot be built here, a
    --do_lower_case that contradicts the checkpoint, a fine-tuning or pretraining set-up (paths, config,
    vocab) that cannot run. Old names: StrategyError, FinetuneError, PretrainingError, CasingMismatchError."""


class InputDataError(BertError):
    """Input data that cannot be used: text or TFRecord files missing, unreadable or not matching the
    flags, a task file (GLUE, SQuAD, SWAG, CoNLL) with a bad line (the message names file and line), a vocab
    file or vocab extension that does not fit, a vocab dynamic masking cannot use, a bad input found inside
    a Beam job. Old names: InputError, TaskDataError, MaskingError, PretrainingDataError, VocabError,
    VocabExtensionError, BeamJobError."""


class CheckpointError(BertError):
    """A checkpoint that cannot be read, loaded into or does not match the model, or a model dir that
    cannot be used (side files missing, another task's or config's checkpoints). Old name: ModelDirError."""


class ExportError(BertError):
    """An export that cannot be made or served: a model_dir, checkpoint or export_dir that cannot be used,
    serving options the task's module cannot work with, ONNX tools missing or failing, a runtime or model
    that cannot be quantized to int8, bad input or a bad export for predict.py. Old names:
    ServingOptionsError, OnnxExportError, QuantizationError, PredictError."""


class OutputDirHeld(BertError):
    """Another live run holds the output_dir (bert_tf/run_holder.py); the message names it."""


class RemotePathError(BertError, OSError):
    """A remote path (gs://, s3://, ...) whose file system cannot be reached or read. Also an OSError, as
    it was before it joined BertError, so `except OSError` keeps catching it."""


class TrainingError(RuntimeError):
    """Training cannot go on: a NaN/Inf loss (no checkpoint written for it), a checkpoint that could not be
    written (its partial files removed) or restored, a peer of a multi-worker run lost (restart every
    worker to resume). A RuntimeError: not the user's input. Old names: NonFiniteLossError,
    CheckpointWriteError, WorkerLostError, CheckpointRestoreError."""


class OutOfDeviceMemory(TrainingError):
    """A batch did not fit in the device's memory; the message names the flags that make it fit. Its own
    class: the scripts end the process at once after it (TensorFlow's teardown can crash after a failed
    allocation)."""


class TrainingPreempted(RuntimeError):
    """SIGTERM arrived; a checkpoint was saved at `step` (the scripts log it and exit 143)."""

    def __init__(self, step: int, checkpoint: Optional[str]):
        super().__init__(f"SIGTERM: saved checkpoint {checkpoint} at step {step}")
        self.step = step
        self.checkpoint = checkpoint


# What the training scripts print as their one `error:` line and exit 1 on (bert_setup.run_and_report):
# every BertError, the ValueError of an argument check (ours or Keras's), every TrainingError.
ONE_LINE_ERRORS = (ValueError, TrainingError)
