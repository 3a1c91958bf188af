"""The network's dense layers as one function, with a backward written for a batch of loss parts.

``dense_stack(torso, head, x, matmul_dtype) -> [R, O]``: ReLU layers ``torso`` (kernels [in, out],
flax's order), then the linear ``head`` (kernel [out, in], ``jdqn.agent.networks.HEAD``).

The learner pulls P loss parts' cotangents back at once (``jax.vmap`` over a VJP; gradient
surgery, docs/design.md, section 5). Autodiff's backward keeps the part axis outermost,
``[P, R, out]``, and XLA wrote each layer's cotangent twice, once per GEMM's layout. Here the
backward's vmap rule (:func:`jax.custom_batching.custom_vmap`) keeps the rows outermost,
``[R, P, out]``, which both of a layer's GEMMs read as it is (input gradient
``[R*P, out] @ W``, kernel gradient ``[R, in]^T @ [R, P*out]``). The head's bias gradient is
summed in a pass of its own, faster at many learners than a column of ones in the GEMM. Under
any other vmap the rule maps the one-part form. The math is autodiff's (ReLU's derivative 0 at
0, bfloat16 inputs rounded where autodiff rounds); only the order of float32 sums may differ.
``Pieces(dense="autodiff")`` (``jdqn.accel.pieces``) runs autodiff instead, for comparison.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from jdqn.accel.pieces import PLAIN, Pieces

Layer = tuple[jax.Array, jax.Array]  # (kernel, bias) float32
Grads = tuple[tuple[Layer, ...], Layer, jax.Array]  # (torso layers', head's, the input's)


def dense_stack(
    torso: tuple[Layer, ...], head: Layer, x: jax.Array, matmul_dtype: str, pieces: Pieces = PLAIN
) -> jax.Array:
    """``relu(... relu(x W_0 + b_0) ...) W_head^T + b_head``: ``x [R, F]`` -> ``[R, O]`` float32.

    Matmul inputs are cast to ``matmul_dtype``; products and everything else are float32.
    Differentiable in reverse mode, to first order (``jax.custom_vjp``; the backward's vmap rule
    has no derivative of its own), which is all the learner takes. ``pieces``: under
    ``dense="autodiff"`` JAX differentiates the forward; ``barriers`` steers the backward.
    """
    if pieces.dense == "autodiff":
        return _forward(torso, head, x.astype(jnp.float32), matmul_dtype)[0]
    return _stack(torso, head, x.astype(jnp.float32), matmul_dtype, pieces.barriers)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _stack(
    torso: tuple[Layer, ...], head: Layer, x: jax.Array, matmul_dtype: str, barriers: bool
) -> jax.Array:
    return _forward(torso, head, x, matmul_dtype)[0]


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
    torso: tuple[Layer, ...], head: Layer, x: jax.Array, matmul_dtype: str, barriers: bool
) -> tuple[jax.Array, tuple[Any, ...]]:
    del barriers
    out, inputs = _forward(torso, head, x, matmul_dtype)
    return out, (inputs, tuple(kernel for kernel, _ in torso), head[0])


def _stack_bwd(
    matmul_dtype: str, barriers: bool, residuals: tuple[Any, ...], cotangent: jax.Array
) -> Grads:
    return _backward(matmul_dtype, barriers)(cotangent, *residuals)  # inputs, kernels, head


_stack.defvjp(_stack_fwd, _stack_bwd)


@functools.cache
def _backward(dtype: str, barriers: bool) -> Any:
    """The one-part backward ``(g [R, O], inputs, kernels, head_kernel) -> (torso grads, head
    grads, x grad)``, whose vmap over the cotangent alone runs :func:`_parts_backward`.
    ``barriers``: False leaves out the head's barrier (``jdqn.accel.pieces``)."""

    def one_part(
        g: jax.Array,
        inputs: tuple[jax.Array, ...],
        kernels: tuple[jax.Array, ...],
        head_kernel: jax.Array,
    ) -> Grads:
        grads = _parts_backward(g[None], inputs, kernels, head_kernel, dtype, barriers)
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
    ) -> tuple[Grads, Any]:
        del axis_size
        g_batched, *rest = in_batched
        if g_batched and not any(jax.tree.leaves(rest)):  # the loss parts: rows outermost
            grads = _parts_backward(g, inputs, kernels, head_kernel, dtype, barriers)
        else:  # another vmap (learners, say): the one-part form, mapped
            axes = jax.tree.map(lambda batched: 0 if batched else None, in_batched)
            grads = jax.vmap(one_part, in_axes=tuple(axes))(g, inputs, kernels, head_kernel)
        return grads, jax.tree.map(lambda _: True, grads)

    return backward


def _parts_backward(
    g: jax.Array,
    inputs: tuple[jax.Array, ...],
    kernels: tuple[jax.Array, ...],
    head_kernel: jax.Array,
    dtype: str,
    barriers: bool,
) -> Grads:
    """P cotangents ``g [P, R, O]`` -> (torso grads, head grads, x grad [P, R, F]), [P, ...]."""
    g = jnp.swapaxes(g, 0, 1)  # [R, P, O]: the one layout both GEMMs of a layer read as it is
    with jax.named_scope("head"):
        g_input = _rounded(jnp.einsum("rpo,oi->rpi", g, _rounded(head_kernel, dtype)), dtype)
        # XLA lets the first of the head's two GEMMs in post order set the layout of the
        # cotangent both read. Through this barrier the kernel gradient's GEMM comes after the
        # input gradient's (rows outermost) whatever order the caller consumes them in; else the
        # cotangent is written twice, [R, P, O] and [P, O, R]. The bias's sum reads through it
        # too: fused into the cotangent's write, that pass is slower than the two apart.
        if barriers:
            g_input, g = jax.lax.optimization_barrier((g_input, g))
        head_kernel_grad, head_bias_grad = _weight_grads(g, inputs[-1], dtype, out_major=True)
        g = g_input
    torso_grads = []
    for layer in reversed(range(len(kernels))):
        with jax.named_scope(f"torso_{layer}"):
            active = inputs[layer + 1] > 0  # [R, out]: relu(a) > 0 exactly where a > 0
            g = jnp.where(active[:, None, :], g, jnp.zeros((), g.dtype))
            torso_grads.append(_weight_grads(g, inputs[layer], dtype, out_major=False))
            g = _rounded(jnp.einsum("rpo,io->rpi", g, _rounded(kernels[layer], dtype)), dtype)
    head_grads = (head_kernel_grad, head_bias_grad)
    return tuple(reversed(torso_grads)), head_grads, jnp.swapaxes(g, 0, 1)


def _weight_grads(g: jax.Array, x: jax.Array, dtype: str, *, out_major: bool) -> Layer:
    """One layer's (kernel gradient, bias gradient), each [P, ...], from its output cotangent
    ``g [R, P, out]`` and its input ``x [R, in]``. The kernel gradient is [P, out, in] when
    ``out_major`` (the head's storage), else [P, in, out]. (The torso's cotangents are
    narrower than the head's, and their bias sums are better left fused into their writes.)"""
    x = _rounded(x, dtype)
    spec, operands = ("rpo,ri->poi", (g, x)) if out_major else ("ri,rpo->pio", (x, g))
    return _rounded(jnp.einsum(spec, *operands), dtype), jnp.sum(g, axis=0)


def _rounded(a: jax.Array, dtype: str) -> jax.Array:
    """``a`` rounded to ``dtype``'s precision, as float32. Autodiff's backward of a GEMM whose
    inputs are cast to ``dtype`` multiplies the float32 cotangent by the rounded inputs and
    rounds the products (the inputs' cotangents) to ``dtype``; this backward does the same, so
    a bfloat16 network's gradients are autodiff's, and a float32 network rounds nothing."""
    return a.astype(dtype).astype(jnp.float32)
