"""Learners over devices and in waves (jdqn.run.placement, issue 36): padding, the memory estimate,
the wave plan, and a run sharded over 4 forced CPU devices against the one-device run."""

from __future__ import annotations

import json
import textwrap
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from child import run_child
from es_sample import ES_FOLDS, ES_SAMPLE
from smoke import SMOKE
from tiny_learner import TINY

from jdqn.agent.train import FoldData, make_train
from jdqn.cli import EXIT_USER_ERROR, main
from jdqn.config import SMOKETEST, apply_overrides
from jdqn.run import memory, placement, rundir
from jdqn.run.checkpoint import META

CPU = SimpleNamespace(platform="cpu")  # a stand-in device: the plan reads only its platform

# The shape of the larger learner `default` had until 2026-12-06: 5 heads, batch 256, a big buffer.
LARGE = ["network.n_heads=5", "network.bootstrap_prob=0.8", "train.batch_size=256",
         "replay.capacity=100000"]  # fmt: skip


def test_padding_repeats_the_last_learner_and_is_dropped_again():
    place = placement.Placement((CPU,) * 4, learners=6)
    assert (place.padded, place.per_device) == (8, 2)
    padded = place.pad({"x": np.arange(6) * 10, "y": np.ones((6, 2))})
    assert padded["x"].tolist() == [0, 10, 20, 30, 40, 50, 50, 50]
    assert padded["y"].shape == (8, 2)
    assert place.real(padded)["x"].tolist() == [0, 10, 20, 30, 40, 50]
    even = placement.Placement((CPU,) * 3, learners=6)
    assert even.pad(np.arange(6)).tolist() == list(range(6))


@pytest.mark.parametrize(
    "cfg",
    [
        apply_overrides(SMOKETEST, TINY),
        SMOKETEST,
        apply_overrides(SMOKETEST, LARGE),
        apply_overrides(SMOKETEST, ["network.n_heads=3", "network.hidden=[32, 16, 8]"]),
    ],
)
def test_the_state_estimate_is_the_traced_state_within_a_few_scalars(cfg):
    n_features, bars = 7, 1000
    program = make_train(cfg, n_features, bars)
    fold = FoldData(
        jax.ShapeDtypeStruct((bars, n_features), np.float32),
        jax.ShapeDtypeStruct((bars,), np.float32),
    )
    state = jax.eval_shape(program.init, jax.random.PRNGKey(0), fold)
    exact = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(state))
    estimate = memory.state_bytes(cfg, n_features)
    assert exact <= estimate <= exact + 64
    assert memory.learner_bytes(cfg, n_features) > estimate


def _plan(learners, free_bytes, cfg=SMOKETEST, devices=4, shared=0):
    return placement.plan_waves(
        cfg, 7, learners, (CPU,) * devices, shared, free=lambda _: free_bytes
    )


def test_learners_that_fit_run_at_once_and_others_in_equal_waves():
    each = memory.learner_bytes(SMOKETEST, 7)
    assert _plan(6, 10**12).wave_size == 6
    # Room for one learner per device (and a half): 6 learners on 4 devices run as 4 + 2.
    tight = _plan(6, int(1.5 * each / placement.MEMORY_FRACTION))
    assert (tight.wave_size, tight.per_device_limit, tight.limit) == (4, 1, "memory")
    assert placement.waves(list(range(6)), tight.wave_size) == [[0, 1, 2, 3], [4, 5]]
    # 10 learners, 2 per device on 2 devices: 3 waves, balanced to 4 each (the last padded).
    assert _plan(10, int(2.5 * each / placement.MEMORY_FRACTION), devices=2).wave_size == 4
    # Fold data every device holds come off the room first.
    assert _plan(6, int(2.5 * each / placement.MEMORY_FRACTION)).wave_size == 6
    assert _plan(6, int(2.5 * each / placement.MEMORY_FRACTION), shared=each).wave_size == 4
    with pytest.raises(placement.PlacementError):
        _plan(6, int(0.5 * each / placement.MEMORY_FRACTION))


def test_a_learner_too_big_for_a_device_is_one_line_naming_the_fix():
    with pytest.raises(placement.PlacementError) as error:
        _plan(1, 10**6, cfg=apply_overrides(SMOKETEST, LARGE))
    message = str(error.value)
    assert "one learner needs about" in message and "fix: lower replay.capacity" in message
    assert "\n" not in message


def test_the_flat_tails_int32_offsets_cap_the_learners_per_device():
    # The flat tail on a CPU; the smoketest's gradient rows: MSE, C51 and the causal term.
    wide = apply_overrides(SMOKETEST, ["network.hidden=[4096]", "accel.pieces=tail=interpret"])
    n_params = memory.param_count(wide, 7)
    per_device = (2**31 - 1 - 1024) // (3 * n_params)
    plan = _plan(4 * per_device + 1, 10**15, cfg=wide)
    assert plan.per_device_limit == per_device and "int32" in plan.limit
    # The bound follows the loss parts: without the causal term, two rows.
    two = apply_overrides(wide, ["loss.causal_weight=0"])
    plan = _plan(10**6, 10**15, cfg=two)
    assert plan.per_device_limit == (2**31 - 1 - 1024) // (2 * n_params)
    huge = apply_overrides(wide, ["network.hidden=[40000, 20000]"])
    with pytest.raises(placement.PlacementError, match="int32 offsets.*fix: set accel.kernels=off"):
        _plan(1, 10**15, cfg=huge)


def test_more_devices_than_the_process_has_is_a_one_line_error(tmp_path, capsys):
    folds = [arg for item in ES_FOLDS for arg in ("--set", item)]
    code = main(
        [*SMOKE, "--data", str(ES_SAMPLE), *folds, "--out", str(tmp_path), "--devices", "9"]
    )
    assert code == EXIT_USER_ERROR
    err = capsys.readouterr().err.strip()
    assert err.startswith("jdqn: error: --devices 9: this process sees 1 cpu device")
    assert "fix: pass --devices 1 to 1" in err and "\n" not in err
    assert not list(tmp_path.iterdir())  # nothing written


# The tiny learner on the real sample: 3 folds x 2 seeds = 6 learners, padded to 8 on 4 devices.
_SHARDED_RUNS = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, "tests")
    from es_sample import ES_FOLDS, ES_SAMPLE
    from tiny_learner import TINY
    from jdqn.run import memory, placement
    from jdqn.run.checkpoint import Checkpointer
    from jdqn.config import SMOKETEST, apply_overrides
    from jdqn.run.walkforward import load_data, run_walkforward

    out = sys.argv[1]
    cfg = apply_overrides(SMOKETEST, [*ES_FOLDS, *TINY, f"data.path={ES_SAMPLE}",
        f"output.out_dir={out}", "output.plots=false", "output.tensorboard=false",
        "train.epochs=2", "train.seeds=2", "walkforward.train_bars=400",
        "walkforward.test_bars=200"])
    notices = []
    for name, devices in (("one", 1), ("four", 4)):
        run_walkforward(cfg, progress=False, name=name, log=lambda _: None, devices=devices)
    # Room for one learner per device: waves of 4 and 2 (padded to 4) on the 4 devices.
    data = load_data(cfg)
    each = memory.learner_bytes(cfg, data.n_features)
    shared = sum(a.features.nbytes + a.close.nbytes for a in (*data.train, *data.test))
    placement.free_bytes = lambda _: int((1.5 * each + shared) / placement.MEMORY_FRACTION)
    # Killed after the first wave's first epoch (its checkpoint written), then resumed.
    save = Checkpointer.save
    def save_then_stop(self, *args):
        save(self, *args)
        self.close()
        raise KeyboardInterrupt
    Checkpointer.save = save_then_stop
    try:
        run_walkforward(cfg, progress=False, name="waves", log=notices.append, devices=4)
    except KeyboardInterrupt:
        pass
    Checkpointer.save = save
    run_walkforward(None, resume=f"{out}/waves.incomplete", progress=False,
        log=notices.append, devices=4)
    print(json.dumps(notices))
    """
)


def _checkpointed_states(*directories):
    """Each directory's checkpointed state at the latest step all of them saved: an epoch's save
    is skipped while the one before is still being written, so which epochs a run saved depends
    on the disk's timing (each keeps its latest two)."""
    saved = [{int(path.stem): path for path in d.glob("*.npz")} for d in directories]
    step = max(set.intersection(*(set(steps) for steps in saved)))
    stored = [rundir.read_arrays(steps[step]) for steps in saved]
    return [[arrays[name] for name in sorted(arrays) if name != META] for arrays in stored]


@pytest.mark.slow
def test_a_run_sharded_over_four_devices_equals_the_one_device_run(tmp_path):
    """6 learners on 4 forced CPU devices (padded to 8) against one device: the same
    results.json, the trained states to float32 rounding; and
    in waves of 4 (room made for one learner per device), killed after the first wave's first
    epoch and resumed."""
    script = f"import sys; sys.argv = ['x', {str(tmp_path)!r}]\n" + _SHARDED_RUNS
    env_code = "import os; os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=4'\n"
    done = run_child(env_code + script, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {
        name: json.loads((tmp_path / name / "results.json").read_text())
        for name in ("one", "four", "waves")
    }
    assert len(results["one"]["folds"]) == 6
    assert results["four"]["folds"] == results["one"]["folds"]
    assert results["waves"]["folds"] == results["one"]["folds"]
    # The trained states (the latest checkpoint both runs saved).
    one, four = _checkpointed_states(
        *(tmp_path / name / "checkpoints" / "group0" for name in ("one", "four"))
    )
    # The trained states agree to float32 rounding: XLA:CPU may order a reduction differently
    # for a device's share of the learners than for all of them.
    assert len(one) == len(four)
    for a, b in zip(one, four, strict=True):
        if np.issubdtype(np.asarray(a).dtype, np.floating):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        else:
            np.testing.assert_array_equal(a, b)
    notices = json.loads(done.stdout.splitlines()[-1])
    assert sum("running 2 waves of 4" in line for line in notices) == 1  # not again on resume
    assert sum("resumed group 0 after epoch 1" in line for line in notices) == 1
    assert json.loads((tmp_path / "waves" / "waves.json").read_text()) == {"wave_sizes": [4]}
    assert sorted(p.name for p in (tmp_path / "waves" / "checkpoints").glob("group*")) == [
        "group0",
        "group1",
    ]


@pytest.mark.slow
def test_the_scaling_section_counts_devices_and_measures_on_one():
    from jdqn.bench import scaling

    assert scaling.device_counts(1) == [1]
    assert scaling.device_counts(4) == [1, 2, 4]
    assert scaling.device_counts(6) == [1, 2, 4, 6]
    rows = scaling.measure(apply_overrides(SMOKETEST, TINY), quick=True, max_devices=1)
    assert [(r["scaling"], r["devices"], r["learners"]) for r in rows] == [
        ("weak", 1, 2),
        ("strong", 1, 2),
    ]
    assert all(r["seed_steps_per_s"] > 0 and r["efficiency"] == 1.0 for r in rows)
    assert "| weak | 1 | 2 |" in scaling.format_table(rows)
