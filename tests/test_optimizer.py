"""The optimizer and schedule against docs/reference.md §4, written out in NumPy."""

import numpy as np
import pytest
import tensorflow as tf

from bert_tf.training import optimizer as opt


def numpy_lr(step, peak, total, warmup):
    decayed = peak * (1.0 - min(step, total) / total)
    if warmup and step < warmup:
        return peak * step / warmup
    return decayed


@pytest.mark.parametrize("total,warmup", [(100, 10), (50, 0), (20, 20)])
def test_schedule_matches_reference(total, warmup):
    schedule = opt.WarmupLinearDecay(1e-4, total, warmup)
    for step in range(0, total + 5):
        np.testing.assert_allclose(float(schedule(step)), numpy_lr(step, 1e-4, total, warmup), rtol=1e-6, atol=1e-12)
    # The decay is not offset by the warmup: right after warmup the lr is already below the peak.
    if warmup and warmup < total:
        assert float(schedule(warmup)) == pytest.approx(1e-4 * (1 - warmup / total), rel=1e-6)
    assert float(schedule(0)) == (0.0 if warmup else pytest.approx(1e-4))


def _variables():
    # Paths like a Keras model's: the LayerNorm and bias ones are excluded from decay.
    rng = np.random.default_rng(0)
    names = ["bert/layer_0/intermediate/kernel", "bert/layer_0/output_LayerNorm/gamma", "bert/pooler/bias"]
    shapes = [(3, 4), (4,), (4,)]
    return [tf.Variable(rng.normal(size=s).astype(np.float32), name=n) for n, s in zip(names, shapes, strict=True)], names


def test_a_compiled_schedule_takes_its_length_as_an_input_not_a_constant():
    """A program that computes the rate (the whole step under XLA) is the same for any number of steps, so a
    run resumed to a larger num_train_steps loads it from the XLA cache instead of compiling it again."""
    import re

    def hlo(total):
        schedule = opt.WarmupLinearDecay(1e-4, total, 10)
        program = tf.function(lambda step: schedule(step), jit_compile=True)
        assert float(program(tf.constant(10))) == pytest.approx(1e-4 * (1 - 10 / total), rel=1e-6)
        return re.sub(r"_\d+", "_N", program.experimental_get_compiler_ir(tf.constant(3))(stage="hlo"))

    short, long = hlo(12345), hlo(54321)
    assert short == long and "12345" not in short and "parameter(3)" in short


def test_adamw_steps_match_numpy():
    variables, names = _variables()
    peak, total, warmup = 0.1, 10, 3
    schedule = opt.WarmupLinearDecay(peak, total, warmup)
    optimizer = opt.AdamWeightDecay(variables, schedule, weight_decay_rate=0.01)
    assert optimizer.decayed_variable_names() == [names[0]]

    w = [v.numpy().copy() for v in variables]
    m = [np.zeros_like(x) for x in w]
    v2 = [np.zeros_like(x) for x in w]
    rng = np.random.default_rng(1)
    for step in range(6):
        grads = [rng.normal(size=x.shape).astype(np.float32) for x in w]
        optimizer.apply_gradients([tf.constant(g) for g in grads])
        lr = numpy_lr(step, peak, total, warmup)
        for i, g in enumerate(grads):
            m[i] = 0.9 * m[i] + 0.1 * g
            v2[i] = 0.999 * v2[i] + 0.001 * g * g
            update = m[i] / (np.sqrt(v2[i]) + 1e-6)  # no bias correction
            if i == 0:
                update = update + 0.01 * w[i]
            w[i] = w[i] - lr * update
        for i, var in enumerate(variables):
            np.testing.assert_allclose(var.numpy(), w[i], rtol=1e-5, atol=1e-7, err_msg=f"step {step} {names[i]}")
    assert int(optimizer.iterations) == 6
    # The slots hold the NumPy moments (no bias correction applied to them).
    np.testing.assert_allclose(optimizer.slots["m"][0].numpy(), m[0], rtol=1e-5, atol=1e-8)


def test_lamb_step_matches_numpy():
    variables, _ = _variables()
    schedule = opt.WarmupLinearDecay(0.01, 100, 0)
    optimizer = opt.Lamb(variables, schedule, weight_decay_rate=0.01)
    w0 = variables[0].numpy().copy()
    g = np.full(w0.shape, 0.5, np.float32)
    optimizer.apply_gradients([tf.constant(g), tf.zeros(4), tf.zeros(4)])
    m, v = 0.1 * g, 0.001 * g * g
    update = (m / 0.1) / (np.sqrt(v / 0.001) + 1e-6) + 0.01 * w0
    ratio = np.linalg.norm(w0) / np.linalg.norm(update)
    np.testing.assert_allclose(variables[0].numpy(), w0 - 0.01 * ratio * update, rtol=1e-5)


def test_clip_by_global_norm():
    grads = [tf.constant([3.0, 0.0]), tf.constant([4.0])]
    clipped, norm = opt.clip_by_global_norm(grads, 1.0)
    assert float(norm) == pytest.approx(5.0)
    np.testing.assert_allclose(clipped[0].numpy(), [0.6, 0.0], rtol=1e-6)
    unclipped, _ = opt.clip_by_global_norm(grads, 0.0)
    np.testing.assert_allclose(unclipped[1].numpy(), [4.0])


def test_unknown_optimizer_is_one_line():
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'; expected one of adamw, lamb"):
        opt.create_optimizer("sgd", [], 1e-4, 10)


def test_slots_checkpoint_round_trip(tmp_path):
    variables, _ = _variables()
    optimizer = opt.AdamWeightDecay(variables, opt.WarmupLinearDecay(0.1, 10, 0))
    optimizer.apply_gradients([tf.ones(v.shape) for v in variables])
    path = tf.train.Checkpoint(optimizer=optimizer).save(str(tmp_path / "ckpt"))
    names = [n for n, _ in tf.train.list_variables(path)]
    # Slots are saved, model variables are not duplicated under the optimizer.
    assert sum("slots" in n for n in names) == 6
    fresh_vars, _ = _variables()
    restored = opt.AdamWeightDecay(fresh_vars, opt.WarmupLinearDecay(0.1, 10, 0))
    tf.train.Checkpoint(optimizer=restored).restore(path).assert_existing_objects_matched()
    assert int(restored.iterations) == 1
    np.testing.assert_allclose(restored.slots["v"][1].numpy(), optimizer.slots["v"][1].numpy())


def test_group_variables():
    assert opt.group_variables([12, 4, 4, 30, 2, 7, None, 3], 16) == [[0, 1], [2], [3], [4, 5], [6], [7]]
    assert opt.group_variables([5, 5], 0) == [[0], [1]]
    assert opt.group_variables([], 16) == []


def _grouping_variables():
    # 96 elements in all; limit 16: groups [0, 1] [2] [3] (30 > 16, alone) [4, 5] [6].
    rng = np.random.default_rng(2)
    names = ["a/kernel", "a/bias", "b/LayerNorm/gamma", "c/kernel", "c/bias", "d/kernel", "e/kernel"]
    shapes = [(3, 4), (4,), (4,), (5, 6), (2,), (7,), (4, 4)]
    return [(n, rng.normal(size=s).astype(np.float32)) for n, s in zip(names, shapes, strict=True)]


def _run_steps(name, max_group_elements, strategy=None, in_function=True, peak=0.01, learning_rate_scales=None):
    """Five updates (apply None / True / False with NaN grads / True / None, varying grad_scale) of
    the grouping variables; -> (variables, slots, iterations) as NumPy, and the optimizer."""
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        variables = [tf.Variable(x, name=n) for n, x in _grouping_variables()]
        cls = opt.AdamWeightDecay if name == "adamw" else opt.Lamb
        optimizer = cls(variables, opt.WarmupLinearDecay(peak, 10, 2), weight_decay_rate=0.01,
                        max_group_elements=max_group_elements, learning_rate_scales=learning_rate_scales)

    def step(grads, apply, scale):
        optimizer.apply_gradients(grads, apply=apply, grad_scale=scale)

    default = strategy is tf.distribute.get_strategy()
    if not default:
        step = tf.function(lambda g, a, s: strategy.run(optimizer.apply_gradients, args=(g, a, s)))
    elif in_function:
        step = tf.function(step)
    rng = np.random.default_rng(3)
    for apply in (None, True, False, True, None):
        grads = [rng.normal(size=v.shape).astype(np.float32) for v in variables]
        if apply is False:
            grads[0][0, 0] = np.nan
        grads = [tf.constant(g) for g in grads]
        apply = None if apply is None else tf.constant(apply)
        scale = tf.constant(float(rng.uniform(0.5, 1.0)))
        step(grads, apply, scale)
    state = ([v.numpy() for v in variables], {k: [s.numpy() for s in v] for k, v in optimizer.slots.items()},
             int(optimizer.iterations))
    return state, optimizer


@pytest.mark.parametrize("name", ["adamw", "lamb"])
@pytest.mark.parametrize("where", ["eager", "function", "one_device"])
def test_grouped_update_is_the_per_variable_update(name, where):
    kwargs = {"in_function": where != "eager"}
    if where == "one_device":
        kwargs["strategy"] = tf.distribute.OneDeviceStrategy("/cpu:0")
    (w_ref, slots_ref, it_ref), per_variable = _run_steps(name, 0, **kwargs)
    (w, slots, it), grouped = _run_steps(name, 16, **kwargs)
    assert per_variable._groups.value == [] and per_variable.group_tracing_count() == 0
    assert grouped._groups.value == [[0, 1], [2], [3], [4, 5], [6]]
    assert it == it_ref == 5
    for i, (a, b) in enumerate(zip(w, w_ref, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"variable {i}")
        assert np.all(np.isfinite(a))
    for k in slots_ref:
        for a, b in zip(slots[k], slots_ref[k], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"slot {k}")
    # The updates moved the variables, and every group function traced once per `apply` kind
    # (None, a tensor) over the five steps: nothing retraces.
    assert not np.array_equal(w[3], _grouping_variables()[3][1])
    assert grouped.group_tracing_count() == 2 * 5


@pytest.mark.parametrize("name", ["adamw", "lamb"])
@pytest.mark.parametrize("max_group_elements", [0, 16])
@pytest.mark.parametrize("where", ["function", "one_device"])
def test_a_variables_learning_rate_scale_is_a_schedule_that_many_times_higher(name, max_group_elements, where):
    kwargs = {"strategy": tf.distribute.OneDeviceStrategy("/cpu:0")} if where == "one_device" else {}
    scales = [1.0, 1.0, 1.0, 20.0, 20.0, 1.0, 1.0]  # c/kernel and c/bias: a head at 20x the rate
    (w, slots, _), _ = _run_steps(name, max_group_elements, learning_rate_scales=scales, **kwargs)
    (w_base, slots_base, _), _ = _run_steps(name, max_group_elements, **kwargs)
    (w_high, slots_high, _), _ = _run_steps(name, max_group_elements, peak=0.2, **kwargs)
    for i, scale in enumerate(scales):
        want, moments = (w_high, slots_high) if scale > 1 else (w_base, slots_base)
        np.testing.assert_allclose(w[i], want[i], rtol=1e-6, atol=1e-7, err_msg=f"variable {i}")
        np.testing.assert_array_equal(slots["m"][i], moments["m"][i])
    assert not np.allclose(w_high[3], w_base[3], atol=1e-3)  # the scale matters for the scaled variables


def test_learning_rate_scales_must_be_one_positive_number_per_variable():
    variables = [tf.Variable(x, name=n) for n, x in _grouping_variables()]
    for scales in ([1.0] * 6, [1.0] * 6 + [0.0]):
        with pytest.raises(ValueError, match="learning_rate_scales must be 7 positive numbers"):
            opt.AdamWeightDecay(variables, opt.WarmupLinearDecay(0.01, 10, 0), learning_rate_scales=scales)


def test_apply_false_keeps_everything_but_the_step_count():
    variables = [tf.Variable(x, name=n) for n, x in _grouping_variables()]
    optimizer = opt.Lamb(variables, opt.WarmupLinearDecay(0.01, 10, 0), max_group_elements=16)
    optimizer.apply_gradients([tf.ones(v.shape) for v in variables])
    before = [v.numpy() for v in variables] + [s.numpy() for s in optimizer.slots["m"] + optimizer.slots["v"]]
    optimizer.apply_gradients([tf.fill(v.shape, np.inf) for v in variables], apply=tf.constant(False))
    after = [v.numpy() for v in variables] + [s.numpy() for s in optimizer.slots["m"] + optimizer.slots["v"]]
    for a, b in zip(after, before, strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(optimizer.iterations) == 2
