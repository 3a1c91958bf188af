"""The double-DQN pick at s' as one Pallas GPU kernel: the online net's Q of every action, its
greedy action a*, and the target net's distribution and Q at a* (van Hasselt et al., AAAI 2016,
on C51's distributions: Bellemare, Dabney & Munos, ICML 2017).

For one row (a sampled transition and one head), with the output layer's GEMM results ``o``
(online) and ``t`` (target), ``[A, N]`` each before their biases ``b_o`` and ``b_t``, and the
support ``z [N]``::

    q_next[a] = sum_i softmax(o[a] + b_o[a])_i z_i
    a*        = argmax_a q_next[a]            (the first of equal maxima; a NaN counts as a max)
    probs*    = softmax(t[a*] + b_t[a*])
    q*        = sum_i probs*_i z_i

In XLA this is a handful of fusions over the ``[R, K, A, N]`` logits of s' (the online Q, a*,
the target softmax at a*), and XLA's Q of s' ran at a quarter of the H200's bandwidth: a
softmax over 51 atoms per row with every row's reduction of its own (67.7 us
at 1,024 vmapped learners; with the rest of the pick ~113 us). Here one launch reads both
nets' logits once and writes ``q_next``, ``probs*`` and ``q*``. The biases are added in the
kernel: the caller passes the head's GEMM results (the head evaluated with a zero bias, which
XLA's algebraic simplifier removes) and the biases, so that ``GEMM + bias`` is not written out
as an array of its own for the kernel to read.

On the H200 the kernel takes 50.9 us of the 1,024-learner step (80 rows each), where XLA's
pick took 101 us in three kernels. It made the step of 16 / 128 / 1,024 vmapped learners
3.5 / 4.6 / 3.8 % faster and one learner's 4.9 % slower, so
``accel.kernels=auto`` takes it from ``jdqn.learner.step.PICK_KERNEL_MIN_LEARNERS`` on.

The learners of a ``vmap`` fold into the kernel's first grid axis (one launch for 1 learner or
1,024); a program handles ``block_rows`` rows of one learner, a row per thread
(:func:`_pick_kernel`). Every output element is written only by its own program (a padded
atom's lane writes its row's last atom again, with that atom's value); no atomics, a fixed order
of operations, deterministic.

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

Impl = Literal["pallas", "interpret", "reference"]
IMPLS: tuple[str, ...] = ("pallas", "interpret", "reference")

# Rows per program and Triton warps: the best of a sweep on the H200.
DEFAULT_BLOCK_ROWS = 8
DEFAULT_NUM_WARPS = 2


class Pick(NamedTuple):
    """What :func:`double_dqn_pick` returns for rows ``[...]`` (leaves gain vmapped axes)."""

    q_next: jax.Array  # [..., A] float32, the online net's Q of every action at s'
    probs_star: jax.Array  # [..., N] float32, the target net's distribution at a*
    q_star: jax.Array  # [...] float32, the target net's Q at a*


def _check(online: tuple[int, ...], online_bias: tuple[int, ...], target, target_bias) -> None:
    """Shapes of one learner's logits [M, K, A, N] (both nets) and biases [K, A, N]."""
    if len(online) != 4 or tuple(target) != tuple(online):
        raise ValueError(
            "double_dqn_pick: want online and target logits [rows, heads, actions, atoms] of one"
            f" shape, got {online} and {target}"
        )
    if tuple(online_bias) != tuple(online[1:]) or tuple(target_bias) != tuple(online[1:]):
        raise ValueError(
            f"double_dqn_pick: want biases [heads, actions, atoms] = {online[1:]}, got"
            f" {online_bias} and {target_bias}"
        )


def double_dqn_pick_reference(
    online: jax.Array,
    online_bias: jax.Array,
    target: jax.Array,
    target_bias: jax.Array,
    support: jax.Array,
) -> Pick:
    """The formulas of the module docstring in jnp: ``online``/``target [M, K, A, N]`` (GEMM
    results before the bias), biases ``[K, A, N]``, ``support [N]``."""
    _check(online.shape, online_bias.shape, target.shape, target_bias.shape)
    q_next = jnp.sum(jax.nn.softmax(online + online_bias, axis=-1) * support, axis=-1)
    a_star = jnp.argmax(q_next, axis=-1)  # [M, K]; the first maximum, a NaN first
    taken = jnp.arange(online.shape[2]) == a_star[..., None]  # [M, K, A]
    logits = jnp.sum(jnp.where(taken[..., None], target + target_bias, 0.0), axis=2)
    probs = jax.nn.softmax(logits, axis=-1)
    return Pick(q_next, probs, jnp.sum(probs * support, axis=-1))


# --------------------------------------------------------------------------------------------
# The kernel: a grid of (learner, block of rows); a row is one (sample, head).
# --------------------------------------------------------------------------------------------


def _pick_kernel(
    online_ref,
    online_bias_ref,
    target_ref,
    target_bias_ref,
    support_ref,
    one_ref,
    q_next_ref,
    probs_ref,
    q_star_ref,
    *,
    rows: int,
    heads: int,
    actions: int,
    atoms: int,
    a_pad: int,
    n_pad: int,
    block_rows: int,
):
    """``block_rows`` rows (sample x head) of one learner; arrays are flat, indexed by hand.

    A row's ``A * N`` logits are contiguous: one load per net takes them all, as an
    ``[a_pad, n_pad, block_rows]`` tile (padded actions x padded atoms x rows). The logit index
    that addresses the tile is multiplied by a 1 read from memory (``one_ref``), which hides the
    tile's contiguity from Triton, so that it lays its threads along the rows and each thread
    holds one row's logits: every per-row reduction is then in-thread (as in
    ``pallas_kernels.c51_projection``, "Layout"). On the H200 at 1,024 learners of 80 rows this
    layout took 50.6 us against 90.7 us for per-action [rows, 64] gathers."""
    learner, block = pl.program_id(0), pl.program_id(1)
    width = actions * atoms
    row = block * block_rows + jnp.arange(block_rows, dtype=jnp.int32)[None, :]  # [1, R]
    action = jnp.arange(a_pad, dtype=jnp.int32)[:, None, None]  # [A, 1, 1]
    atom = jnp.arange(n_pad, dtype=jnp.int32)[:, None]  # [N, 1]
    logit = action * atoms + atom[None]  # [A, N, 1]
    shape = (a_pad, n_pad, block_rows)
    one = plgpu.load(one_ref.at[pl.ds(0, 1)])  # [1]
    address = jnp.broadcast_to(logit * one[None, None, :], shape)
    row_ok = row < rows  # [1, R]
    in_row = (action < actions) & (atom < atoms)[None]  # [A, N, 1]
    valid = in_row & row_ok[None]  # [A, N, R]
    z = plgpu.load(support_ref.at[atom], mask=atom < atoms, other=0.0)  # [N, 1]
    start = (learner * rows + row)[None] * width + address  # [A, N, R]
    head = (learner * heads + (row % heads if heads > 1 else 0)) * width  # [1, R] or []
    bias_at = head + address

    def softmax(x):  # over the atoms; padded atoms hold -inf, and exp gives 0 there
        e = jnp.exp(x - jnp.max(x, axis=-2, keepdims=True))
        return e / jnp.sum(e, axis=-2, keepdims=True)

    def logits(ref, bias_ref):
        x = plgpu.load(ref.at[start], mask=valid, other=-jnp.inf)
        return x + plgpu.load(bias_ref.at[bias_at], mask=valid, other=0.0)

    action_of_q = jnp.arange(a_pad, dtype=jnp.int32)[:, None]  # [A, 1]
    q = jnp.sum(softmax(logits(online_ref, online_bias_ref)) * z[None], axis=1)  # [A, R]
    out_row = learner * rows + row  # [1, R]
    # Each action's row of q by a masked sum (Triton lowers no slices), stored on its own: a
    # padded action's index would be the next row's first action's.
    q_rows = [
        jnp.sum(jnp.where(action_of_q == a, q, 0.0), axis=0, keepdims=True) for a in range(actions)
    ]
    for a, q_a in enumerate(q_rows):
        plgpu.store(q_next_ref.at[out_row * actions + a], q_a, mask=row_ok)
    best = q_rows[0]  # [1, R]
    a_star = jnp.zeros((1, block_rows), jnp.int32)
    for a, q_a in enumerate(q_rows[1:], start=1):
        # jnp.argmax: strictly greater wins, so the first of equal maxima stays; the first NaN
        # wins and stays (a NaN compares false with everything, itself included).
        take = ((q_a > best) | (q_a != q_a)) & (best == best)
        best = jnp.where(take, q_a, best)
        a_star = jnp.where(take, a, a_star)
    target = logits(target_ref, target_bias_ref)
    picked = jnp.sum(jnp.where(action == a_star[None], target, 0.0), axis=0)  # [N, R]
    probs = softmax(picked)
    # A padded atom's lane stores the row's last atom again, with its value: every lane then
    # writes, to its own row, the value that belongs there. (With a mask instead, its index
    # would be the next row's first atoms', and interpret mode writes masked lanes too, with
    # the old value, in an order it does not fix.)
    last = jnp.sum(jnp.where(atom == atoms - 1, probs, 0.0), axis=0, keepdims=True)  # [1, R]
    plgpu.store(
        probs_ref.at[out_row * atoms + jnp.minimum(atom, atoms - 1)],
        jnp.where(atom < atoms, probs, last),
        mask=jnp.broadcast_to(row_ok, probs.shape),
    )
    plgpu.store(q_star_ref.at[out_row], jnp.sum(probs * z, axis=0, keepdims=True), mask=row_ok)


def double_dqn_pick_pallas(
    online: jax.Array,
    online_bias: jax.Array,
    target: jax.Array,
    target_bias: jax.Array,
    support: jax.Array,
    *,
    interpret: bool,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    num_warps: int = DEFAULT_NUM_WARPS,
) -> Pick:
    """The kernel on ``L`` learners: logits ``[L, M, K, A, N]``, biases ``[L, K, A, N]``,
    support ``[N]`` (shared). ``block_rows`` and ``num_warps`` are launch knobs for
    benchmarking. Raises ``ValueError`` where int32 offsets would overflow."""
    learners, samples, heads, actions, atoms = online.shape
    _check(*(x.shape[1:] for x in (online, online_bias, target, target_bias)))
    rows = samples * heads
    if learners * rows * actions * atoms >= 2**31:
        raise ValueError(
            f"double_dqn_pick: {learners} learners x {rows} rows x {actions * atoms} logits"
            " exceed the kernel's int32 offsets"
        )
    block_rows = max(1, min(block_rows, pl.next_power_of_2(rows)))
    kernel = functools.partial(
        _pick_kernel,
        rows=rows,
        heads=heads,
        actions=actions,
        atoms=atoms,
        a_pad=pl.next_power_of_2(actions),
        n_pad=pl.next_power_of_2(atoms),
        block_rows=block_rows,
    )

    def flat(x):
        return x.astype(jnp.float32).reshape(-1)

    q_next, probs, q_star = pl.pallas_call(
        kernel,
        out_shape=(
            jax.ShapeDtypeStruct((learners * rows * actions,), jnp.float32),
            jax.ShapeDtypeStruct((learners * rows * atoms,), jnp.float32),
            jax.ShapeDtypeStruct((learners * rows,), jnp.float32),
        ),
        grid=(learners, pl.cdiv(rows, block_rows)),
        interpret=interpret,
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        name="double_dqn_pick",
    )(
        flat(online),
        flat(online_bias),
        flat(target),
        flat(target_bias),
        flat(support),
        jnp.ones((1,), jnp.int32),  # the kernel's run-time 1 (see _pick_kernel)
    )
    lead = (learners, samples, heads)
    return Pick(q_next.reshape(*lead, actions), probs.reshape(*lead, atoms), q_star.reshape(lead))


@functools.cache
def _batched(interpret: bool, block_rows: int, num_warps: int):
    """The kernel on a leading learner axis, with a vmap rule that folds the mapped axis into
    it: nested vmaps end in one launch. The support is the same for every learner."""

    @jax.custom_batching.custom_vmap
    def pick(online, online_bias, target, target_bias, support):
        return double_dqn_pick_pallas(
            online,
            online_bias,
            target,
            target_bias,
            support,
            interpret=interpret,
            block_rows=block_rows,
            num_warps=num_warps,
        )

    @pick.def_vmap
    def _fold(axis_size, in_batched, online, online_bias, target, target_bias, support):
        if in_batched[4]:
            raise ValueError("double_dqn_pick: the support must be the same for every learner")

        def lead(x, batched):
            return x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))

        mapped = [
            lead(x, b)
            for x, b in zip((online, online_bias, target, target_bias), in_batched, strict=False)
        ]
        learners = mapped[0].shape[1]
        folded = [x.reshape(axis_size * learners, *x.shape[2:]) for x in mapped]
        out = pick(*folded, support)
        out = jax.tree.map(lambda x: x.reshape(axis_size, learners, *x.shape[1:]), out)
        return out, jax.tree.map(lambda _: True, out)

    return pick


def double_dqn_pick(
    online: jax.Array,
    online_bias: jax.Array,
    target: jax.Array,
    target_bias: jax.Array,
    support: jax.Array,
    impl: Impl = "pallas",
) -> Pick:
    """The double-DQN pick at s' (module docstring) for rows of ``[M, K]`` (samples x heads):
    ``online``/``target [M, K, A, N]`` float32, the output layer's GEMM results before the bias;
    ``online_bias``/``target_bias [K, A, N]``; ``support [N]``. Returns :class:`Pick`. Targets
    are constants: no gradient flows through it. Works under ``jax.vmap`` (one launch for all
    mapped learners; the support must not be mapped)."""
    if impl not in IMPLS:
        raise ValueError(f"double_dqn_pick: impl must be one of {IMPLS}, got {impl!r}")
    args = jax.tree.map(
        lambda x: jax.lax.stop_gradient(jnp.asarray(x, jnp.float32)),
        (online, online_bias, target, target_bias, support),
    )
    _check(*(x.shape for x in args[:4]))
    if impl == "reference":
        return double_dqn_pick_reference(*args)
    pick = _batched(impl == "interpret", DEFAULT_BLOCK_ROWS, DEFAULT_NUM_WARPS)
    out = pick(*(x[None] for x in args[:4]), args[4])  # one learner
    return Pick(*(x[0] for x in out))
