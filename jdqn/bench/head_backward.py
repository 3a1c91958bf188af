"""Benchmark of the head's backward from the taken actions' cotangent: the Pallas kernel
(``pallas_kernels.head_backward``) against XLA's form of the same work (the cotangent expanded
to every action by a select, then the two GEMMs and the bias's sum, as the learner step's
autodiff computes them), on ``L`` vmapped learners.

Each row is one implementation (the kernel at one launch: Triton warps x pipeline stages x
programs per learner): its device time per call from ``jax.profiler``
(``jdqn.bench.projection.kernel_us``) and its largest difference from the jnp reference. The
HBM floor is the bytes the kernel must move (the compact cotangent, x and W read once; the three
gradients written) at ``jdqn.bench.projection.HBM_BYTES_PER_S``.

    python -m jdqn.bench.head_backward [--learners 1024] [--repeats 50] [--sweep]

``--sweep`` times the kernel at every launch of :data:`SWEEP`; without it, at the default
launch only. Off a GPU the kernel runs in interpret mode, which only checks that the table is
computed (its times mean nothing).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jdqn.bench.projection import HBM_BYTES_PER_S, kernel_us
from pallas_kernels import head_backward

# The smoketest step's shape: 64 sampled rows and 16 donors, the MSE and C51 parts, one head,
# 3 actions, 51 atoms, 64 inputs (the last hidden layer).
ROWS, PARTS, HEADS, ACTIONS, ATOMS, INPUTS = 80, 2, 1, 3, 51, 64
# (warps, stages, one program per part)
SWEEP: tuple[tuple[int, int, bool], ...] = tuple(
    (warps, stages, split)
    for split in (False, True)
    for warps in (2, 4, 8, 16)
    for stages in (1, 2)
)


def make_inputs(key: jax.Array, learners: int) -> tuple[jax.Array, ...]:
    """Compact cotangent ``[L, R, P, K, N]``, actions ``[L, R]``, input ``[L, R, I]`` and
    kernel ``[L, K*A*N, I]``."""
    k_g, k_a, k_x, k_w = jax.random.split(key, 4)
    g = jax.random.normal(k_g, (learners, ROWS, PARTS, HEADS, ATOMS))
    action = jax.random.randint(k_a, (learners, ROWS), 0, ACTIONS)
    x = jax.random.normal(k_x, (learners, ROWS, INPUTS))
    w = 0.1 * jax.random.normal(k_w, (learners, HEADS * ACTIONS * ATOMS, INPUTS))
    return g, action, x, w


def hbm_bytes(learners: int) -> int:
    """Bytes the kernel must move: the compact cotangent, x and W read; dW, db and dx written."""
    out = HEADS * ACTIONS * ATOMS
    read = ROWS * PARTS * HEADS * ATOMS + ROWS * INPUTS + out * INPUTS + ROWS
    write = PARTS * out * INPUTS + PARTS * out + ROWS * PARTS * INPUTS
    return 4 * learners * (read + write)


def run(
    learners: int = 1024,
    repeats: int = 50,
    launches: Sequence[tuple[int, int, bool]] | None = None,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row for XLA's form, then one per kernel launch (warps, stages, split parts)."""
    args = make_inputs(jax.random.key(seed), learners)

    def one(impl, g, action, x, w):
        return head_backward.head_backward(g, action, x, w, ACTIONS, impl=impl)

    reference = jax.jit(jax.vmap(functools.partial(one, "reference")))(*args)
    interpret = jax.default_backend() != "gpu"
    variants: list[tuple[str, Any]] = [
        ("xla", jax.jit(jax.vmap(functools.partial(one, "reference"))))
    ]
    default = (head_backward.DEFAULT_NUM_WARPS, head_backward.DEFAULT_NUM_STAGES, False)
    for warps, stages, split in launches or (default,):
        pallas = functools.partial(
            head_backward.head_backward_pallas,
            n_actions=ACTIONS,
            interpret=interpret,
            num_warps=warps,
            num_stages=stages,
            split_parts=split,
        )
        per = "part" if split else "learner"
        variants.append(
            (f"kernel, {warps} warps x {stages} stages, a program per {per}", jax.jit(pallas))
        )
    floor_us = 1e6 * hbm_bytes(learners) / HBM_BYTES_PER_S
    out = []
    for name, fn in variants:
        got = fn(*args)
        diff = max(float(jnp.max(jnp.abs(g - r))) for g, r in zip(got, reference, strict=True))
        out.append(
            {
                "impl": name,
                "learners": learners,
                "kernel_us": kernel_us(fn, args, repeats),
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
