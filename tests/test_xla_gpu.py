"""bert_tf/training/xla_gpu.py: the XLA flags the scripts add on a GPU before TensorFlow starts, the user's
own settings kept (--compile_whole_step through the script: test_run_pretraining)."""

from bert_tf.training import xla_gpu


def test_gpu_defaults_are_added_once_and_the_users_setting_stands():
    env = {"XLA_FLAGS": "--xla_gpu_cuda_data_dir=/usr/local/cuda"}
    assert xla_gpu.apply_gpu_defaults(env) == [xla_gpu.CUDNN_LAYER_NORM]
    assert env["XLA_FLAGS"] == "--xla_gpu_cuda_data_dir=/usr/local/cuda --xla_gpu_enable_cudnn_layer_norm=true"
    assert xla_gpu.apply_gpu_defaults(env) == [] and env["XLA_FLAGS"].count("cudnn_layer_norm") == 1
    assert xla_gpu.in_effect(env) == "--xla_gpu_enable_cudnn_layer_norm=true"
    opted_out = {"XLA_FLAGS": "--xla_gpu_enable_cudnn_layer_norm=false"}
    assert xla_gpu.apply_gpu_defaults(opted_out) == []
    assert opted_out["XLA_FLAGS"] == "--xla_gpu_enable_cudnn_layer_norm=false"
    empty = {}
    assert xla_gpu.apply_gpu_defaults(empty) == [xla_gpu.CUDNN_LAYER_NORM] and xla_gpu.in_effect({}) is None
    assert empty["XLA_FLAGS"] == xla_gpu.CUDNN_LAYER_NORM
