"""The network's dense layers as one function, with a backward written for a batch of loss parts.

``dense_stack(torso, head, x, matmul_dtype) -> [R, O]``: ReLU layers ``torso`` (kernels [in, out],
flax's order), then the linear ``head`` (kernel [out, in], ``jdqn.networks.HEAD``). The forward
is the plain one; the backward is hand-written because of how the learner uses it.

The learner needs each loss part's gradient on its own (gradient surgery, DESIGN section 6), so
it pulls P cotangents back through the network at once: ``jax.vmap`` over a VJP. Autodiff's
backward of a dense layer under that vmap keeps the part axis outermost, ``[P, R, out]``. The
kernel gradient contracts over the rows R, and its GEMM wants the part and output axes side by
side, so XLA wrote each layer's cotangent twice, once per GEMM's layout. For the head at 1,024
vmapped learners on the H200 that write took 115 us of a 1,500 us step (BENCHMARKS.md, A5).

Here the backward has a vmap rule (:func:`jax.custom_batching.custom_vmap`) that keeps the rows
outermost, ``[R, P, out]``, a layout both of a layer's GEMMs read as it is:

- the input gradient, ``[R*P, out] @ W -> [R, P, in]``: rows and parts are one GEMM dimension;
- the kernel gradient, ``[R, in]^T @ [R, P*out] -> [in, P, out]``: the parts and outputs are.

Each bias's gradient is the cotangent summed over the rows. On the H200 the learner step became
1.3-1.9 % faster at 1,024 vmapped learners and 6.9-7.1 % at 128 (BENCHMARKS.md, B3-B4); one
learner's step did not move beyond the runs' spread. Summing the head's bias in a pass of its
own, after the cotangent is written, took 3.9 % more off at 1,024 learners (C1). Taking the
biases' gradients from the kernel-gradient GEMM, with a column of ones on each layer's input,
made those GEMMs 65 columns wide and twice as slow (B1), so it was measured and dropped.

Under any other vmap (over learners, or a single part), the rule maps the one-part form. The
math is autodiff's: ReLU's derivative is 0 at 0, as ``jax.nn.relu``'s, and bfloat16 matmul
inputs round where autodiff's do. Only the order of float32 sums may differ.

``dense_stack_taken(torso, head, x, action, head_shape, matmul_dtype, impl)`` also returns each
row's action's columns ``[R, K, N]`` of the output, and differentiates only those: its backward
takes the parts' cotangents in that compact form and runs the head's part of it as one kernel
(``pallas_kernels.head_backward``), the torso's as above. For ``loss.head_impl``, an opt-in
experiment: with XLA's GEMMs instead of the kernel the compact form was slower, because the
GEMMs read the cotangent expanded, which XLA then wrote out (BENCHMARKS.md, D1).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from pallas_kernels.head_backward import Impl, head_backward

Layer = tuple[jax.Array, jax.Array]  # (kernel, bias) float32
Grads = tuple[tuple[Layer, ...], Layer, jax.Array]  # (torso layers', head's, the input's)
HeadShape = tuple[int, int, int]  # the head's output per row: (heads K, actions A, atoms N)


def dense_stack(
    torso: tuple[Layer, ...], head: Layer, x: jax.Array, matmul_dtype: str
) -> jax.Array:
    """``relu(... relu(x W_0 + b_0) ...) W_head^T + b_head``: ``x [R, F]`` -> ``[R, O]`` float32.

    Matmul inputs are cast to ``matmul_dtype``; products and everything else are float32.
    Differentiable in reverse mode, to first order (``jax.custom_vjp``; the backward's vmap rule
    has no derivative of its own), which is all the learner takes.
    """
    return _stack(torso, head, x.astype(jnp.float32), matmul_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _stack(torso: tuple[Layer, ...], head: Layer, x: jax.Array, matmul_dtype: str) -> jax.Array:
    return _forward(torso, head, x, matmul_dtype)[0]


def dense_stack_taken(
    torso: tuple[Layer, ...],
    head: Layer,
    x: jax.Array,
    action: jax.Array,
    head_shape: HeadShape,
    matmul_dtype: str,
    impl: Impl = "pallas",
) -> tuple[jax.Array, jax.Array]:
    """(:func:`dense_stack`'s output ``[R, O]``, each row's action's columns ``[R, K, N]``).

    The head's output is ``[K, A, N]`` per row (heads, actions, atoms; ``O = K * A * N``) and
    ``action [R]`` (int) names each row's action. The first output is a value only: it has no
    gradient (the caller stops it; were a cotangent to reach it, it would be added to the
    second's, exact as ever). The second is differentiable, and its backward takes the loss
    parts' cotangents in that compact form: a loss that reads only the taken action's logits
    (the MSE and C51 parts) has a head cotangent that is zero in the other actions' columns, and
    here the backward never writes those zeros out ``[R, P, O]`` for the head's GEMMs and bias
    sum to read.
    """
    if x.shape[0] != action.shape[0]:
        raise ValueError(f"action: {action.shape} must give one action per row of x {x.shape}")
    return _stack_taken(torso, head, x.astype(jnp.float32), action, head_shape, matmul_dtype, impl)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _stack_taken(
    torso: tuple[Layer, ...],
    head: Layer,
    x: jax.Array,
    action: jax.Array,
    head_shape: HeadShape,
    matmul_dtype: str,
    impl: Impl,
) -> tuple[jax.Array, jax.Array]:
    out = _forward(torso, head, x, matmul_dtype)[0]
    return out, _taken_columns(out, action, head_shape)


def _taken_columns(out: jax.Array, action: jax.Array, head_shape: HeadShape) -> jax.Array:
    """``out [R, K*A*N]`` -> ``[R, K, N]`` at each row's action: a select and a sum over the
    actions, as ``jdqn.losses.select_action`` (no gather)."""
    out = out.reshape(out.shape[0], *head_shape)
    taken = _onehot(action, head_shape[1])[:, None, :, None]
    return jnp.sum(jnp.where(taken, out, jnp.zeros((), out.dtype)), axis=2)


def _onehot(action: jax.Array, n_actions: int) -> jax.Array:
    """[R, A] bool, true at each row's action."""
    return jnp.arange(n_actions) == action[:, None]


def _expanded(g: jax.Array, action: jax.Array, n_actions: int) -> jax.Array:
    """The taken columns' cotangent ``g [R, ..., K, N]`` as the whole output's ``[R, ..., O]``:
    zero in the other actions' columns (selected, never multiplied)."""
    taken = _onehot(action, n_actions).reshape(g.shape[0], *(1,) * (g.ndim - 2), n_actions, 1)
    dense = jnp.where(taken, g[..., None, :], jnp.zeros((), g.dtype))  # [R, ..., K, A, N]
    return dense.reshape(*g.shape[:-2], -1)


def _stack_taken_fwd(
    torso: Any,
    head: Any,
    x: Any,
    action: Any,
    head_shape: HeadShape,
    matmul_dtype: str,
    impl: Impl,
) -> tuple[tuple[jax.Array, jax.Array], tuple[Any, ...]]:
    # With symbolic zeros every argument's leaf comes wrapped (CustomVJPPrimal); only the
    # values are read.
    torso, head, x, action = jax.tree.map(lambda leaf: leaf.value, (torso, head, x, action))
    out, inputs = _forward(torso, head, x, matmul_dtype)
    residuals = (inputs, tuple(kernel for kernel, _ in torso), head[0], action)
    return (out, _taken_columns(out, action, head_shape)), residuals


def _stack_taken_bwd(
    head_shape: HeadShape,
    matmul_dtype: str,
    impl: Impl,
    residuals: tuple[Any, ...],
    cotangents: tuple[Any, jax.Array],
) -> tuple[Any, ...]:
    inputs, kernels, head_kernel, action = residuals
    g_out, g_taken = cotangents
    if isinstance(g_out, SymbolicZero):  # the learner's case: the compact backward
        grads = _backward(matmul_dtype, head_shape, impl)(
            g_taken, inputs, kernels, head_kernel, action
        )
    else:
        g = g_out + _expanded(g_taken, action, head_shape[1])
        grads = _backward(matmul_dtype, None)(g, inputs, kernels, head_kernel, None)
    return (*grads, None)


_stack_taken.defvjp(_stack_taken_fwd, _stack_taken_bwd, symbolic_zeros=True)


def _dot(a: jax.Array, b: jax.Array, dtype: str) -> jax.Array:
    """``a @ b`` with inputs in ``dtype`` and a float32 product."""
    return jnp.dot(a.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)


def _forward(
    torso: tuple[Layer, ...], head: Layer, x: jax.Array, dtype: str
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """(output [R, O], each layer's input [R, in_l]: x, then the ReLU outputs)."""
    inputs = []
    h = x
    for layer, (kernel, bias) in enumerate(torso):
        inputs.append(h)
        with jax.named_scope(f"torso_{layer}"):  # the layers' names in profiles and HLO
            h = jax.nn.relu(_dot(h, kernel, dtype) + bias)
    inputs.append(h)
    kernel, bias = head
    with jax.named_scope("head"):
        return _dot(h, kernel.T, dtype) + bias, tuple(inputs)


def _stack_fwd(
    torso: tuple[Layer, ...], head: Layer, x: jax.Array, matmul_dtype: str
) -> tuple[jax.Array, tuple[Any, ...]]:
    out, inputs = _forward(torso, head, x, matmul_dtype)
    return out, (inputs, tuple(kernel for kernel, _ in torso), head[0])


def _stack_bwd(matmul_dtype: str, residuals: tuple[Any, ...], cotangent: jax.Array) -> Grads:
    inputs, kernels, head_kernel = residuals
    return _backward(matmul_dtype, None)(cotangent, inputs, kernels, head_kernel, None)


_stack.defvjp(_stack_fwd, _stack_bwd)


@functools.cache
def _backward(dtype: str, head_shape: HeadShape | None, impl: Impl = "pallas") -> Any:
    """The one-part backward ``(g, inputs, kernels, head_kernel, action) -> (torso grads, head
    grads, x grad)``, whose vmap over the cotangent alone runs :func:`_parts_backward`. With a
    ``head_shape`` the head's cotangent is the taken columns' ``g [R, K, N]`` at ``action [R]``
    (:func:`dense_stack_taken`); without, the whole output's ``g [R, O]`` (``action`` None)."""

    def one_part(
        g: jax.Array,
        inputs: tuple[jax.Array, ...],
        kernels: tuple[jax.Array, ...],
        head_kernel: jax.Array,
        action: jax.Array | None,
    ) -> Grads:
        grads = _parts_backward(
            g[None], inputs, kernels, head_kernel, dtype, action, head_shape, impl
        )
        return jax.tree.map(lambda a: a[0], grads)

    backward = jax.custom_batching.custom_vmap(one_part)

    @backward.def_vmap
    def _rule(
        axis_size: int,
        in_batched: list[Any],
        g: jax.Array,
        inputs: tuple[jax.Array, ...],
        kernels: tuple[jax.Array, ...],
        head_kernel: jax.Array,
        action: jax.Array | None,
    ) -> tuple[Grads, Any]:
        del axis_size
        g_batched, *rest = in_batched
        if g_batched and not any(jax.tree.leaves(rest)):  # the loss parts: rows outermost
            grads = _parts_backward(
                g, inputs, kernels, head_kernel, dtype, action, head_shape, impl
            )
        else:  # another vmap (learners, say): the one-part form, mapped
            axes = jax.tree.map(lambda batched: 0 if batched else None, in_batched)
            grads = jax.vmap(one_part, in_axes=tuple(axes))(g, inputs, kernels, head_kernel, action)
        return grads, jax.tree.map(lambda _: True, grads)

    return backward


def _parts_backward(
    g: jax.Array,
    inputs: tuple[jax.Array, ...],
    kernels: tuple[jax.Array, ...],
    head_kernel: jax.Array,
    dtype: str,
    action: jax.Array | None = None,
    head_shape: HeadShape | None = None,
    impl: Impl = "pallas",
) -> Grads:
    """P cotangents ``g [P, R, O]`` (or the taken columns' ``[P, R, K, N]`` at ``action``, with
    ``head_shape``) -> (torso grads, head grads, x grad [P, R, F]), each [P, ...]."""
    g = jnp.swapaxes(g, 0, 1)  # [R, P, ...]: the one layout both GEMMs of a layer read as it is
    with jax.named_scope("head"):
        if head_shape is None or action is None:
            head_kernel_grad, head_bias_grad = _weight_grads(
                g, inputs[-1], dtype, out_major=True, bias_apart=True
            )
            g = _rounded(jnp.einsum("rpo,oi->rpi", g, _rounded(head_kernel, dtype)), dtype)
        else:  # the taken columns' [R, P, K, N]: one kernel (pallas_kernels.head_backward)
            x, w = _rounded(inputs[-1], dtype), _rounded(head_kernel, dtype)
            grads = head_backward(g, action, x, w, head_shape[1], impl)
            head_kernel_grad, head_bias_grad = _rounded(grads.kernel, dtype), grads.bias
            g = _rounded(grads.x, dtype)
    torso_grads = []
    for layer in reversed(range(len(kernels))):
        with jax.named_scope(f"torso_{layer}"):
            active = inputs[layer + 1] > 0  # [R, out]: relu(a) > 0 exactly where a > 0
            g = jnp.where(active[:, None, :], g, jnp.zeros((), g.dtype))
            torso_grads.append(_weight_grads(g, inputs[layer], dtype, out_major=False))
            g = _rounded(jnp.einsum("rpo,io->rpi", g, _rounded(kernels[layer], dtype)), dtype)
    head_grads = (head_kernel_grad, head_bias_grad)
    return tuple(reversed(torso_grads)), head_grads, jnp.swapaxes(g, 0, 1)


def _weight_grads(
    g: jax.Array, x: jax.Array, dtype: str, *, out_major: bool, bias_apart: bool = False
) -> Layer:
    """One layer's (kernel gradient, bias gradient), each [P, ...], from its output cotangent
    ``g [R, P, out]`` and its input ``x [R, in]``. The kernel gradient is [P, out, in] when
    ``out_major`` (the head's storage), else [P, in, out]. ``bias_apart``: the bias's sum reads
    ``g`` once it is written, in a pass of its own (below)."""
    x = _rounded(x, dtype)
    spec, operands = ("rpo,ri->poi", (g, x)) if out_major else ("ri,rpo->pio", (x, g))
    # XLA fuses the rows' sum into the pass that writes the head's cotangent, and at 1,024
    # vmapped learners on the H200 that pass then took 180 us, against 88 us for the write and
    # 41 us for the sum apart: the barrier keeps them apart (-3.9 % a step; BENCHMARKS.md, C1).
    # The torso's cotangents are narrower, and their sums are better left fused (C1).
    summed = jax.lax.optimization_barrier(g) if bias_apart else g
    return _rounded(jnp.einsum(spec, *operands), dtype), jnp.sum(summed, axis=0)


def _rounded(a: jax.Array, dtype: str) -> jax.Array:
    """``a`` rounded to ``dtype``'s precision, as float32. Autodiff's backward of a GEMM whose
    inputs are cast to ``dtype`` multiplies the float32 cotangent by the rounded inputs and
    rounds the products (the inputs' cotangents) to ``dtype``; this backward does the same, so
    a bfloat16 network's gradients are autodiff's, and a float32 network rounds nothing."""
    return a.astype(dtype).astype(jnp.float32)
