"""The output layer's backward from the taken actions' cotangent, as one Pallas GPU kernel.

For the loss parts that read only each row's taken action (the MSE and C51 parts), the head's
cotangent ``[R, P, K*A*N]`` is zero outside the taken action's ``N`` columns of each head. Given
the compact cotangent ``g [R, P, K, N]``, the rows' actions ``a [R]``, the head's input
``x [R, I]`` and kernel ``W [K*A*N, I]`` (``[out, in]``), for each part ``p``::

    dW[p, (k, b, n), :] = sum_{r: a_r = b} g[r, p, k, n] x[r, :]     (the kernel's gradient)
    db[p, (k, b, n)]    = sum_{r: a_r = b} g[r, p, k, n]             (the bias's)
    dx[r, p, :]         = sum_{k, n} g[r, p, k, n] W[(k, a_r, n), :]  (the input's)

XLA computes these from the cotangent written out in its dense form (a third of it non-zero):
the write and the two GEMMs and the bias's sum that read it. Here one program per learner reads
the compact cotangent, x and W once and writes the three results: per action ``b``, two dots on
the rows whose action is ``b`` (the others masked to zero).

The learners of a ``vmap`` fold into the kernel's grid (one launch for 1 learner or 1,024).
Every output element is written by one program only. A padded input lane rewrites its row's
last input, with that input's value; a padded atom's or row's store is masked, and its address
is the next action's, head's, part's or learner's, which that program or a later one writes
afterwards (interpret mode writes masked lanes back with their current values; the outputs have
room for the last learner's padded lanes). Dots run at JAX's
matmul precision (TF32 by default on a GPU, as XLA's GEMMs; IEEE under ``highest``).

``impl``: ``"pallas"`` (Triton-lowered, GPU), ``"interpret"`` (the same kernel in interpret mode,
CPU tests) or ``"reference"`` (the formulas above in jnp).
"""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.folding import learner_folding

Impl = Literal["pallas", "interpret", "reference"]
IMPLS: tuple[str, ...] = ("pallas", "interpret", "reference")

# Triton warps per program: a guess, not tuned (the kernel has not run on a GPU yet;
# BENCHMARKS.md, P102).
DEFAULT_NUM_WARPS = 4
DEFAULT_NUM_STAGES = 1


class HeadGrads(NamedTuple):
    """What :func:`head_backward` returns (leaves gain vmapped axes)."""

    kernel: jax.Array  # [P, O, I] float32, O = K*A*N
    bias: jax.Array  # [P, O] float32
    x: jax.Array  # [R, P, I] float32, the input's gradient


def _check(g, action, x, w, n_actions: int) -> None:
    if len(g) != 4:
        raise ValueError(f"head_backward: want the cotangent [rows, parts, heads, atoms], got {g}")
    rows, _, heads, atoms = g
    out = heads * n_actions * atoms
    if tuple(action) != (rows,) or len(x) != 2 or x[0] != rows or tuple(w) != (out, x[1]):
        raise ValueError(
            f"head_backward: want actions [{rows}], x [{rows}, in] and W [{out}, in], got"
            f" {action}, {x} and {w}"
        )


def head_backward_reference(
    g: jax.Array, action: jax.Array, x: jax.Array, w: jax.Array, n_actions: int
) -> HeadGrads:
    """The formulas of the module docstring in jnp, through the dense cotangent."""
    _check(g.shape, action.shape, x.shape, w.shape, n_actions)
    taken = jnp.arange(n_actions) == action[:, None]  # [R, A]
    dense = jnp.where(taken[:, None, None, :, None], g[:, :, :, None, :], 0.0)
    dense = dense.reshape(*g.shape[:2], -1)  # [R, P, O]
    return HeadGrads(
        jnp.einsum("rpo,ri->poi", dense, x),
        jnp.sum(dense, axis=0),
        jnp.einsum("rpo,oi->rpi", dense, w),
    )


def _kernel(
    g_ref,
    action_ref,
    x_ref,
    w_ref,
    dw_ref,
    db_ref,
    dx_ref,
    *,
    rows: int,
    parts: int,
    heads: int,
    actions: int,
    atoms: int,
    inputs: int,
    r_pad: int,
    n_pad: int,
    i_pad: int,
    split_parts: bool,
):
    """One learner (and with ``split_parts`` one part; else both), every head and action."""
    learner = pl.program_id(0)
    part_ids = [pl.program_id(1)] if split_parts else range(parts)
    out = heads * actions * atoms
    r = jnp.arange(r_pad, dtype=jnp.int32)
    n = jnp.arange(n_pad, dtype=jnp.int32)
    i = jnp.arange(i_pad, dtype=jnp.int32)
    r_ok, n_ok = r < rows, n < atoms
    # A padded input lane reads and writes its row's last input again: its values are then
    # that input's (a dot's columns are computed apart), so it rewrites what belongs there.
    # Only where there are padded lanes: Triton cannot see through the clamp that the lanes'
    # addresses are contiguous, which the loads and stores need to be vectorised.
    if i_pad != inputs:
        i = jnp.minimum(i, inputs - 1)
    row = learner * rows + r  # [Rp]
    ri_ok = jnp.broadcast_to(r_ok[:, None], (r_pad, i_pad))
    ni_ok = jnp.broadcast_to(n_ok[:, None], (n_pad, i_pad))
    x = plgpu.load(x_ref.at[row[:, None] * inputs + i[None, :]], mask=ri_ok, other=0.0)
    action = plgpu.load(action_ref.at[row], mask=r_ok, other=-1)  # [Rp]
    for p in part_ids:
        dx = jnp.zeros((r_pad, i_pad), jnp.float32)
        for k in range(heads):
            at = ((row * parts + p) * heads + k)[:, None] * atoms + n[None, :]
            g = plgpu.load(g_ref.at[at], mask=r_ok[:, None] & n_ok[None, :], other=0.0)
            for b in range(actions):
                g_b = jnp.where((action == b)[:, None], g, 0.0)  # [Rp, Np]
                o = (k * actions + b) * atoms + n  # [Np]
                dw = jax.lax.dot_general(g_b, x, (((0,), (0,)), ((), ())))  # [Np, Ip]
                base = (learner * parts + p) * out + o
                plgpu.store(dw_ref.at[base[:, None] * inputs + i[None, :]], dw, mask=ni_ok)
                plgpu.store(db_ref.at[base], jnp.sum(g_b, axis=0), mask=n_ok)
                at_w = (learner * out + o)[:, None] * inputs + i[None, :]
                w = plgpu.load(w_ref.at[at_w], mask=ni_ok, other=0.0)  # [Np, Ip]
                dx = dx + jnp.dot(g_b, w)
        plgpu.store(dx_ref.at[(row * parts + p)[:, None] * inputs + i[None, :]], dx, mask=ri_ok)


def head_backward_pallas(
    g: jax.Array,
    action: jax.Array,
    x: jax.Array,
    w: jax.Array,
    n_actions: int,
    *,
    interpret: bool,
    num_warps: int = DEFAULT_NUM_WARPS,
    num_stages: int = DEFAULT_NUM_STAGES,
    split_parts: bool = False,
) -> HeadGrads:
    """The kernel on ``L`` learners: ``g [L, R, P, K, N]``, ``action [L, R]``, ``x [L, R, I]``,
    ``w [L, O, I]``. Raises ``ValueError`` where int32 offsets would overflow."""
    learners, rows, parts, heads, atoms = g.shape
    _check(g.shape[1:], action.shape[1:], x.shape[1:], w.shape[1:], n_actions)
    inputs, out = x.shape[-1], w.shape[1]
    if learners * max(parts * out, rows * parts) * inputs >= 2**31 - 2**20:
        raise ValueError(f"head_backward: {learners} learners exceed the kernel's int32 offsets")
    r_pad, n_pad, i_pad = (pl.next_power_of_2(v) for v in (rows, atoms, inputs))
    kernel = functools.partial(
        _kernel,
        rows=rows,
        parts=parts,
        heads=heads,
        actions=n_actions,
        atoms=atoms,
        inputs=inputs,
        r_pad=r_pad,
        n_pad=n_pad,
        i_pad=i_pad,
        split_parts=split_parts,
    )
    # Room for the last learner's padded lanes (masked; see the module docstring).
    size_dw, size_db, size_dx = (
        learners * parts * out * inputs,
        learners * parts * out,
        learners * rows * parts * inputs,
    )
    slack = (n_pad - atoms + 1) * i_pad
    dw, db, dx = pl.pallas_call(
        kernel,
        out_shape=(
            jax.ShapeDtypeStruct((size_dw + slack,), jnp.float32),
            jax.ShapeDtypeStruct((size_db + n_pad,), jnp.float32),
            jax.ShapeDtypeStruct((size_dx + (r_pad - rows + 1) * parts * i_pad,), jnp.float32),
        ),
        grid=(learners, parts) if split_parts else (learners,),
        interpret=interpret,
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        name="head_backward",
    )(
        g.astype(jnp.float32).reshape(-1),
        action.astype(jnp.int32).reshape(-1),
        x.astype(jnp.float32).reshape(-1),
        w.astype(jnp.float32).reshape(-1),
    )
    return HeadGrads(
        dw[:size_dw].reshape(learners, parts, out, inputs),
        db[:size_db].reshape(learners, parts, out),
        dx[:size_dx].reshape(learners, rows, parts, inputs),
    )


@functools.cache
def _batched(interpret: bool, n_actions: int):
    """The kernel on a leading learner axis; nested vmaps fold into it (one launch)."""
    return learner_folding(
        functools.partial(head_backward_pallas, n_actions=n_actions, interpret=interpret)
    )


def head_backward(
    g: jax.Array,
    action: jax.Array,
    x: jax.Array,
    w: jax.Array,
    n_actions: int,
    impl: Impl = "pallas",
) -> HeadGrads:
    """The head's gradients (module docstring) for one learner: ``g [R, P, K, N]``, ``action
    [R]`` (int), ``x [R, I]``, ``w [K*A*N, I]``. Works under ``jax.vmap`` (one launch)."""
    if impl not in IMPLS:
        raise ValueError(f"head_backward: impl must be one of {IMPLS}, got {impl!r}")
    g, x, w = (jnp.asarray(a, jnp.float32) for a in (g, x, w))
    action = jnp.asarray(action, jnp.int32)
    _check(g.shape, action.shape, x.shape, w.shape, n_actions)
    if impl == "reference":
        return head_backward_reference(g, action, x, w, n_actions)
    grads = _batched(impl == "interpret", n_actions)(g[None], action[None], x[None], w[None])
    return HeadGrads(*(a[0] for a in grads))
