"""Benchmark of prioritized replay: ``replay_sample`` and ``replay_update``.

A full buffer of ``capacity`` slots (random priorities, ``--features`` features per row) is
sampled and updated through ``jax.jit``; each figure is the median over ``--repeats`` calls after a
compile and warm-up call, each call ended by ``block_until_ready``. Two views:

- per call from a Python loop (includes dispatch, ~10-30 us on CPU);
- per step inside one ``lax.scan`` of ``--scan-steps`` sample+update steps (the learner's view:
  no dispatch), reported as scan time / steps.

``replay_update`` donates its state (as the learner does), so the scatter is in place and its
cost does not include a copy of the ``[C]`` priorities.

    python -m benchmarks.replay [--repeats 50] [--features 16]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from jdqn.accel.xla_flags import configure
from jdqn.agent.replay import ReplayState, replay_add, replay_init, replay_sample, replay_update
from jdqn.agent.transition import Transition, example_transition

# (capacity, batch): the smoketest buffer/batch and a 1e6-slot buffer at the default batch.
SIZES: tuple[tuple[int, int], ...] = ((256, 64), (1_000_000, 256))
ALPHA, BETA, EPS, PRIORITY_MAX = 0.6, 0.4, 1e-3, 1e3


def full_buffer(capacity: int, n_features: int, key: jax.Array) -> ReplayState:
    """A buffer with every slot written and priorities spread over [1e-3, 1e3]."""
    state = replay_init(capacity, example_transition(n_features))
    data_key, priority_key = jax.random.split(key)
    rows = jax.tree.map(
        lambda leaf: jax.random.normal(data_key, (capacity, *leaf.shape)).astype(leaf.dtype),
        example_transition(n_features),
    )
    state = jax.jit(replay_add)(state, Transition(*rows))
    log10_p = jax.random.uniform(priority_key, (capacity,), minval=-3.0, maxval=3.0)
    return state._replace(priorities=10.0**log10_p)


def median_us(fn: Callable[[], object], repeats: int) -> float:
    jax.block_until_ready(fn())  # compile + warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def bench_size(capacity: int, batch: int, n_features: int, repeats: int, scan_steps: int) -> dict:
    state = full_buffer(capacity, n_features, jax.random.key(0))
    key = jax.random.key(1)

    sample = jax.jit(lambda s, k: replay_sample(s, k, batch, ALPHA, jnp.float32(BETA)))
    sample_us = median_us(lambda: sample(state, key), repeats)

    update = jax.jit(
        lambda s, i, p: replay_update(s, i, p, None, EPS, PRIORITY_MAX), donate_argnums=0
    )
    indices = sample(state, key)[0]
    new_priorities = jax.random.uniform(jax.random.key(2), (batch,), maxval=10.0)
    holder = {"state": jax.tree.map(jnp.copy, state)}

    def one_update() -> jax.Array:
        holder["state"] = update(holder["state"], indices, new_priorities)
        return holder["state"].priorities

    update_us = median_us(one_update, repeats)

    def scan_steps_fn(s: ReplayState, k: jax.Array) -> ReplayState:
        def body(carry: ReplayState, step_key: jax.Array) -> tuple[ReplayState, None]:
            idx, drawn, _ = replay_sample(carry, step_key, batch, ALPHA, jnp.float32(BETA))
            carry = replay_update(carry, idx, jnp.abs(drawn.reward) + 0.1, None, EPS, PRIORITY_MAX)
            return carry, None

        return jax.lax.scan(body, s, jax.random.split(k, scan_steps))[0]

    scanned = jax.jit(scan_steps_fn, donate_argnums=0)
    holder["state"] = jax.tree.map(jnp.copy, state)

    def one_scan() -> jax.Array:
        holder["state"] = scanned(holder["state"], key)
        return holder["state"].priorities

    scan_us = median_us(one_scan, max(3, repeats // 10)) / scan_steps
    return {
        "capacity": capacity,
        "batch": batch,
        "sample_us": sample_us,
        "update_us": update_us,
        "scan_step_us": scan_us,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--scan-steps", type=int, default=100)
    args = parser.parse_args(argv)
    device = jax.devices()[0]
    print(f"jax {jax.__version__}, device {device.device_kind} ({device.platform})")
    print(
        "| capacity | batch | sample per call (us) | update per call (us) "
        "| sample+update in scan (us/step) |"
    )
    print("|---:|---:|---:|---:|---:|")
    for capacity, batch in SIZES:
        row = bench_size(capacity, batch, args.features, args.repeats, args.scan_steps)
        print(
            f"| {capacity:,} | {batch} | {row['sample_us']:.1f} | {row['update_us']:.1f} "
            f"| {row['scan_step_us']:.1f} |"
        )


if __name__ == "__main__":
    configure()  # jdqn's XLA flags, before JAX starts a backend
    main()
