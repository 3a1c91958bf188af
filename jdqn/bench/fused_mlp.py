"""Does one program per learner beat XLA at the network's forward and backward? (issue 6)

Issue 6's in-scan and many-seed goals were judged to need each learner's forward, losses and
backward in one program, its activations on chip (BENCHMARKS.md, V1 and the ninth session).
This measures the first piece of that idea: the smoketest network's MLP (a two-layer torso and
the C51 head of Bellemare et al., ICML 2017; no spectral norm, no losses) forward and, from a
given output cotangent, its six weight and bias gradients,

- as one Pallas (Triton) program per learner (:func:`fused_forward_backward`), on tiles of
  powers of two (rows 80 -> 128, outputs 3 x 51 = 153 -> 256; the arrays stored padded, as a
  fused learner would keep them), against
- XLA: ``jax.jit(jax.vmap(...))`` of ``jax.vjp`` of the same MLP on the unpadded arrays.

On the H200 the one-program form was 1.3-2.4x slower than XLA per call (BENCHMARKS.md,
"Thirteenth session", W6): a program's [128, 256] float32 output and cotangent tiles do not fit
in its registers, and each of its six small dots runs alone on one SM. ``--out-blocks`` times
programs that work on the head's outputs in smaller blocks (smaller tiles at once); they were
written after W6 and have been checked on CPU only (interpret mode, lowering for the H200).

Each is timed per call from Python and per iteration of a ``lax.fori_loop`` of passes (as a
training scan runs it; at one learner a call from Python is mostly its dispatch).

    python -m jdqn.bench.fused_mlp [--learners 1 128 1024] [--warps 4 8] [--repeats 50]
        [--steps 200] [--out-blocks 256 64]
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# The smoketest learner's online forward: 64 + 16 rows (batch and HER donors), 15 features and
# the position, hidden [64, 64], 3 actions x 51 atoms.
ROWS, INPUTS, HIDDEN, OUTPUTS = 80, 16, 64, 153
ROWS_TILE, OUTPUTS_TILE = 128, 256  # Triton tiles are powers of two

Params = tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]


def mlp(params: Params, x: jax.Array) -> jax.Array:
    """``x [R, in] -> [R, out]``: two ReLU layers, then a linear head."""
    w1, b1, w2, b2, w3, b3 = params
    h1 = jax.nn.relu(x @ w1 + b1)
    h2 = jax.nn.relu(h1 @ w2 + b2)
    return h2 @ w3 + b3


def xla_forward_backward(params: Params, x: jax.Array, dy: jax.Array) -> tuple[jax.Array, Params]:
    """One learner's output and gradients through ``jax.vjp`` (XLA's program)."""
    y, pull_back = jax.vjp(lambda p: mlp(p, x), params)
    return y, pull_back(dy)[0]


def _kernel(x_ref, w1_ref, b1_ref, w2_ref, b2_ref, w3_ref, b3_ref, dy_ref, *out_refs, out_block):
    y_ref, dw1_ref, db1_ref, dw2_ref, db2_ref, dw3_ref, db3_ref = out_refs
    x, w1, w2 = x_ref[...], w1_ref[...], w2_ref[...]
    z1 = jnp.dot(x, w1) + b1_ref[...][None, :]
    h1 = jnp.maximum(z1, 0.0)
    z2 = jnp.dot(h1, w2) + b2_ref[...][None, :]
    h2 = jnp.maximum(z2, 0.0)
    # The head in blocks of ``out_block`` outputs: a smaller block holds smaller tiles of the
    # output and its cotangent at once (W6: the whole [128, 256] pair did not fit).
    dh2 = jnp.zeros((ROWS_TILE, HIDDEN), jnp.float32)
    for start in range(0, OUTPUTS_TILE, out_block):
        cols = pl.ds(start, out_block)
        w3, dy = w3_ref[:, cols], dy_ref[:, cols]
        y_ref[:, cols] = jnp.dot(h2, w3) + b3_ref[cols][None, :]
        dw3_ref[:, cols] = jnp.dot(h2.T, dy)
        db3_ref[cols] = jnp.sum(dy, axis=0)
        dh2 = dh2 + jnp.dot(dy, w3.T)
    dz2 = jnp.where(z2 > 0, dh2, 0.0)
    dw2_ref[...] = jnp.dot(h1.T, dz2)
    db2_ref[...] = jnp.sum(dz2, axis=0)
    dz1 = jnp.where(z1 > 0, jnp.dot(dz2, w2.T), 0.0)
    dw1_ref[...] = jnp.dot(x.T, dz1)
    db1_ref[...] = jnp.sum(dz1, axis=0)


def fused_forward_backward(
    params: Params,
    x: jax.Array,
    dy: jax.Array,
    *,
    interpret: bool = False,
    warps: int = 4,
    out_block: int = OUTPUTS_TILE,
) -> tuple[jax.Array, Params]:
    """``(y, (dw1, db1, dw2, db2, dw3, db3))`` of ``L`` learners, one program each, as
    :func:`xla_forward_backward` gives them; every array has a leading learner axis and the
    padded tile shapes (:func:`pad`). ``out_block``: how many
    of the head's outputs the program works on at once (a power of two dividing 256)."""
    if out_block < 16 or OUTPUTS_TILE % out_block:
        raise ValueError(f"out_block {out_block}: use 16, 32, 64, 128 or 256")
    w1, b1, w2, b2, w3, b3 = params

    def block(*shape: int) -> pl.BlockSpec:
        return pl.BlockSpec((None, *shape), lambda i: (i,) + (0,) * len(shape))

    inputs = [
        (ROWS_TILE, INPUTS),
        (INPUTS, HIDDEN),
        (HIDDEN,),
        (HIDDEN, HIDDEN),
        (HIDDEN,),
        (HIDDEN, OUTPUTS_TILE),
        (OUTPUTS_TILE,),
        (ROWS_TILE, OUTPUTS_TILE),
    ]
    outputs = [(ROWS_TILE, OUTPUTS_TILE), *inputs[1:7]]
    learners = x.shape[0]
    y, *grads = pl.pallas_call(
        functools.partial(_kernel, out_block=out_block),
        grid=(learners,),
        in_specs=[block(*shape) for shape in inputs],
        out_specs=[block(*shape) for shape in outputs],
        out_shape=[jax.ShapeDtypeStruct((learners, *s), jnp.float32) for s in outputs],
        interpret=interpret,
        compiler_params=None if interpret else plgpu.CompilerParams(num_warps=warps, num_stages=1),
        name="fused_mlp",
    )(x, w1, b1, w2, b2, w3, b3, dy)
    return y, tuple(grads)  # type: ignore[return-value]


def random_inputs(learners: int, seed: int = 0) -> tuple[Params, np.ndarray, np.ndarray]:
    """Parameters, inputs and output cotangents of ``learners`` learners (unpadded)."""
    rng = np.random.default_rng(seed)

    def draw(*shape: int) -> np.ndarray:
        return (0.3 * rng.normal(size=(learners, *shape))).astype(np.float32)

    params = (
        draw(INPUTS, HIDDEN),
        draw(HIDDEN),
        draw(HIDDEN, HIDDEN),
        draw(HIDDEN),
        draw(HIDDEN, OUTPUTS),
        draw(OUTPUTS),
    )
    return params, draw(ROWS, INPUTS), draw(ROWS, OUTPUTS)  # type: ignore[return-value]


def pad(params: Params, x: np.ndarray, dy: np.ndarray) -> tuple[Params, np.ndarray, np.ndarray]:
    """The arrays zero-padded to the kernel's tiles (padded rows and outputs add nothing)."""
    w1, b1, w2, b2, w3, b3 = params
    extra_rows, extra_outputs = ROWS_TILE - ROWS, OUTPUTS_TILE - OUTPUTS
    padded = (
        w1,
        b1,
        w2,
        b2,
        np.pad(w3, ((0, 0), (0, 0), (0, extra_outputs))),
        np.pad(b3, ((0, 0), (0, extra_outputs))),
    )
    return (
        padded,  # type: ignore[return-value]
        np.pad(x, ((0, 0), (0, extra_rows), (0, 0))),
        np.pad(dy, ((0, 0), (0, extra_rows), (0, extra_outputs))),
    )


def compare(learners: int, *, interpret: bool, out_block: int = OUTPUTS_TILE) -> float:
    """The largest difference between the fused program's outputs and XLA's (unpadded part)."""
    params, x, dy = jax.tree.map(jnp.asarray, random_inputs(learners))
    y, grads = jax.vmap(xla_forward_backward)(params, x, dy)
    padded_params, padded_x, padded_dy = jax.tree.map(jnp.asarray, pad(params, x, dy))
    fused_y, fused_grads = fused_forward_backward(
        padded_params, padded_x, padded_dy, interpret=interpret, out_block=out_block
    )
    got = (
        fused_y[:, :ROWS, :OUTPUTS],
        *fused_grads[:4],
        fused_grads[4][..., :OUTPUTS],
        fused_grads[5][..., :OUTPUTS],
    )
    return max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(got, (y, *grads), strict=True))


def _xla_pass(params: Params, x: jax.Array, dy: jax.Array) -> tuple[jax.Array, Params]:
    return jax.vmap(xla_forward_backward)(params, x, dy)


def looped(forward_backward: Any, steps: int) -> Any:
    """jit((params, x, dy) -> params after ``steps`` passes in one ``lax.fori_loop``): each pass
    moves the weights by its gradients and its output, so no pass can be hoisted or dropped."""

    def run(params: Params, x: jax.Array, dy: jax.Array) -> Params:
        def body(_: jax.Array, carry: Params) -> Params:
            y, grads = forward_backward(carry, x, dy)
            *kept, b3 = (p - 1e-6 * g for p, g in zip(carry, grads, strict=True))
            # The output's real rows only (the fused program's padded rows are not outputs).
            return (*kept, b3 - 1e-9 * jnp.sum(y[..., :ROWS, :], axis=-2))  # type: ignore[return-value]

        return jax.lax.fori_loop(0, steps, body, params)

    return jax.jit(run)


def _median_us(fn: Any, args: Any, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - start)
    return 1e6 * float(np.median(samples))


def time_both(
    learners: int, warps: int, repeats: int, steps: int, out_block: int = OUTPUTS_TILE
) -> dict[str, list[float]]:
    """Microseconds of XLA's and the fused program's pass, each measured twice in alternation:
    per call from Python (median of ``repeats`` calls, each blocked on; at one learner this is
    the dispatch) and per iteration of a ``steps``-pass loop (median of ``repeats // 10 + 1``
    loops), which is how a training scan runs them."""
    params, x, dy = random_inputs(learners)
    fused = functools.partial(fused_forward_backward, warps=warps, out_block=out_block)
    runs: tuple[tuple[str, Any, Any], ...] = (
        ("xla", _xla_pass, jax.device_put((params, x, dy))),
        ("fused", fused, jax.device_put(pad(params, x, dy))),
    )
    times: dict[str, list[float]] = {"xla": [], "fused": [], "xla_loop": [], "fused_loop": []}
    for name, one_pass, args in runs * 2:
        times[name].append(_median_us(jax.jit(one_pass), args, repeats))
        loop_us = _median_us(looped(one_pass, steps), args, repeats // 10 + 1)
        times[f"{name}_loop"].append(loop_us / steps)
    return times


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, nargs="+", default=[1, 128, 1024])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--steps", type=int, default=200, help="passes per timed loop")
    parser.add_argument(
        "--out-blocks",
        type=int,
        nargs="+",
        default=[OUTPUTS_TILE, 64],
        help="head outputs a program works on at once (powers of two dividing 256)",
    )
    args = parser.parse_args(argv)
    bad = [b for b in args.out_blocks if b < 16 or OUTPUTS_TILE % b]
    if bad:
        parser.error(f"--out-blocks {bad}: use powers of two from 16 to {OUTPUTS_TILE}")
    if min(*args.learners, args.repeats, args.steps) < 1:
        parser.error("--learners, --repeats and --steps: each must be at least 1")
    if any(w not in (1, 2, 4, 8, 16, 32) for w in args.warps):
        parser.error(f"--warps {args.warps}: Triton takes powers of two from 1 to 32")
    if jax.default_backend() != "gpu":
        parser.error(
            "the fused program is a GPU kernel; run this on a GPU (the tests check it "
            "in interpret mode)"
        )
    for out_block in args.out_blocks:
        difference = compare(3, interpret=False, out_block=out_block)
        print(f"largest difference from XLA (L = 3, output block {out_block}): {difference:.2e}")
    print(
        "| learners | warps | output block | XLA us per call | fused us per call "
        "| XLA us per loop iteration | fused us per loop iteration | fused / XLA in the loop |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for learners in args.learners:
        for warps in args.warps:
            for out_block in args.out_blocks:
                t = time_both(learners, warps, args.repeats, args.steps, out_block)
                cells = [", ".join(f"{v:.1f}" for v in t[k]) for k in ("xla", "fused")]
                loops = ("xla_loop", "fused_loop")
                cells += [", ".join(f"{v:.2f}" for v in t[k]) for k in loops]
                ratio = np.mean(t["fused_loop"]) / np.mean(t["xla_loop"])
                row = f"| {learners} | {warps} | {out_block} | " + " | ".join(cells)
                print(f"{row} | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
