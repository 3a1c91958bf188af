"""Benchmark of the double-DQN pick at s': the Pallas kernel (``pallas_kernels.double_dqn``)
against the learner step's XLA form of the same work (``jdqn.networks.q_values``, then
``jdqn.losses.double_dqn_target`` on the biased logits), on ``L`` vmapped learners.

Each row is one implementation (the kernel at one launch: rows per program x Triton warps):
its device time per call from ``jax.profiler`` (``benchmarks.projection.kernel_us``: the
kernels of one call summed, median over calls; nothing of the host's dispatch) and its largest
difference from the jnp reference. The HBM floor is the bytes the pick must move (both nets'
logits read once, ``q_next``, ``probs*`` and ``q*`` written) at
``benchmarks.projection.HBM_BYTES_PER_S``.

    python -m benchmarks.pick [--learners 1024] [--repeats 50] [--sweep]

``--sweep`` times the kernel at every launch of :data:`SWEEP` (how the
default was chosen); without it, at the default launch only. Off a GPU the kernel runs in interpret
mode, which only checks that the table is computed (its times mean nothing).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks.projection import HBM_BYTES_PER_S, kernel_us
from jdqn import losses, networks
from pallas_kernels import double_dqn

# The smoketest step's shape: 64 sampled rows and 16 donors, one head, 3 actions, 51 atoms.
ROWS, HEADS, ACTIONS, ATOMS = 80, 1, 3, 51
SWEEP: tuple[tuple[int, int], ...] = tuple(
    (rows, warps) for rows in (4, 8, 16, 32) for warps in (1, 2, 4)
)


def make_inputs(key: jax.Array, learners: int) -> tuple[jax.Array, ...]:
    """Online and target head outputs ``[L, M, K, A, N]`` (before the bias), their biases
    ``[L, K, A, N]``, and the support ``[N]``."""
    keys = jax.random.split(key, 4)
    shape = (learners, ROWS, HEADS, ACTIONS, ATOMS)
    online, target = (2.0 * jax.random.normal(k, shape) for k in keys[:2])
    online_bias, target_bias = (
        0.1 * jax.random.normal(k, (learners, *shape[2:])) for k in keys[2:]
    )
    return online, online_bias, target, target_bias, jnp.linspace(-10.0, 10.0, ATOMS)


def xla_pick(online, online_bias, target, target_bias, support) -> double_dqn.Pick:
    """The learner step's XLA form of the pick (``JDQN_KERNELS=pick=xla``), on one learner."""
    q_next = networks.q_values(online + online_bias, support)
    _, probs, q_star = losses.double_dqn_target(q_next, target + target_bias, support)
    return double_dqn.Pick(q_next, probs, q_star)


def hbm_bytes(learners: int) -> int:
    """Bytes the pick must move: both nets' logits (and biases) read, its outputs written."""
    rows = learners * ROWS * HEADS
    read = 2 * rows * ACTIONS * ATOMS + 2 * learners * HEADS * ACTIONS * ATOMS
    return 4 * (read + rows * (ACTIONS + ATOMS + 1))


def run(
    learners: int = 1024,
    repeats: int = 50,
    launches: Sequence[tuple[int, int]] | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row for XLA's form, then one per kernel launch (rows per program, warps)."""
    args = make_inputs(jax.random.key(seed), learners)
    support = args[4]

    def one_reference(online, online_bias, target, target_bias):
        return double_dqn.double_dqn_pick(
            online, online_bias, target, target_bias, support, impl="reference"
        )

    reference = jax.jit(jax.vmap(one_reference))(*args[:4])
    interpret = jax.default_backend() != "gpu"
    variants: list[tuple[str, Any]] = [
        ("xla", jax.jit(jax.vmap(xla_pick, in_axes=(0, 0, 0, 0, None))))
    ]
    default = (double_dqn.DEFAULT_BLOCK_ROWS, double_dqn.DEFAULT_NUM_WARPS)
    for rows, warps in launches or (default,):
        pallas = functools.partial(
            double_dqn.double_dqn_pick_pallas,
            interpret=interpret,
            block_rows=rows,
            num_warps=warps,
        )
        variants.append((f"kernel, {rows} rows x {warps} warps", jax.jit(pallas)))
    floor_us = 1e6 * hbm_bytes(learners) / HBM_BYTES_PER_S
    out = []
    for name, fn in variants:
        got = fn(*args)
        diff = max(float(jnp.max(jnp.abs(g - r))) for g, r in zip(got, reference, strict=True))
        median = kernel_us(fn, args, repeats)
        out.append(
            {
                "impl": name,
                "learners": learners,
                "kernel_us": median,
                "hbm_floor_us": floor_us,
                "max_abs_diff_vs_reference": diff,
            }
        )
        print(format_table(out[-1:]).splitlines()[-1], flush=True)  # progress
    return out


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| implementation | learners | kernel us | HBM floor us | max abs diff vs reference |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['impl']} | {r['learners']} | {r['kernel_us']:.1f} | {r['hbm_floor_us']:.1f} "
            f"| {r['max_abs_diff_vs_reference']:.1e} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--sweep", action="store_true", help="every launch of SWEEP")
    args = parser.parse_args(argv)
    if args.learners < 1 or args.repeats < 1:
        parser.error("--learners and --repeats must be at least 1")
    rows = run(args.learners, args.repeats, SWEEP if args.sweep else None)
    print(format_table(rows))


if __name__ == "__main__":
    main()
