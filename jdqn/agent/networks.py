"""C51 MLP with a spectral-normalised torso, pruning masks and ensemble heads (docs/design.md,
section 4).

The network is a flax linen module; everything around it is a pure function over explicit
state (:class:`NetworkState`), so the learner can carry, select and vmap every piece.
:func:`effective_params` (mask, then spectral norm) is the only place a power iteration happens.

Parameter tree: ``{"torso_0": {"kernel": [F+1, H0], "bias": [H0]}, ..., "head": {"kernel":
[K*A*N, H_last], "bias": [K*A*N]}}``: torso kernels are flax's [in, out], the head's is stored
[out, in] (:data:`HEAD`). ``sn_u`` maps each torso layer name to its ``[H_l]`` vector.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, NamedTuple, cast

import chex
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from jdqn.accel.pieces import PLAIN, Pieces
from jdqn.agent.dense_stack import dense_stack
from jdqn.config import Config, NetworkConfig
from jdqn.data.features import odd_features

Params = Any  # {layer: {"kernel": [in, out] ([out, in] for HEAD), "bias": [out]}} float32

_SN_EPS = 1e-12  # guards the power-iteration normalisation against a zero vector

# The output layer. Its kernel is stored [out, in] (torch's ``nn.Linear`` order), not flax's
# [in, out]: XLA computes the per-loss-part gradients of this kernel as one GEMM with the parts
# stacked on the output rows, [P * K*A*N, H], already in this order (no transpose per step).
HEAD = "head"


class NetworkState(NamedTuple):
    """Online network parameters with their pruning masks and spectral-norm vectors."""

    params: Params  # layer tree, float32
    masks: Params  # same tree as params, {0, 1} float32 (biases always 1)
    sn_u: dict[str, jax.Array]  # {torso_l: [H_l] float32}, empty when spectral norm is off


class ParamLayout(NamedTuple):
    """Where each leaf of the parameter tree sits in one flat float32 vector ``[n_params]``
    (leaf order of ``jax.tree.leaves``, each leaf row-major): the gradient surgery's rows, and
    the record a checkpoint keeps of the tree's shapes."""

    treedef: Any  # jax tree structure of the parameter tree
    shapes: tuple[tuple[int, ...], ...]  # per leaf
    offsets: tuple[int, ...]  # per leaf, into the flat vector
    size: int  # n_params

    def unravel(self, flat: jax.Array) -> Params:
        """``[n_params]`` -> the parameter tree (static slices and reshapes)."""
        cuts = zip(self.offsets, self.shapes, strict=True)
        return self.tree(tuple(flat[at : at + math.prod(shape)] for at, shape in cuts))

    def tree(self, segments: tuple[jax.Array, ...]) -> Params:
        """The leaves' ``[n_k]`` segments, in flat order -> the parameter tree."""
        leaves = [x.reshape(shape) for x, shape in zip(segments, self.shapes, strict=True)]
        return jax.tree.unflatten(self.treedef, leaves)

    def record(self) -> list[list[Any]]:
        """Each leaf's path and shape in flat order (JSON-ready), kept by checkpoints: a resume
        refuses another layout of the same size (an old [in, out] head would load transposed)."""
        numbered = jax.tree.unflatten(self.treedef, range(len(self.shapes)))
        paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(numbered)[0]]
        return [
            [jax.tree_util.keystr(path), list(shape)]
            for path, shape in zip(paths, self.shapes, strict=True)
        ]

    def ravel(self, tree: Params) -> jax.Array:
        """The parameter tree (or one shaped like it) -> ``[n_params]``."""
        return ravel_pytree(tree)[0]


def param_layout(cfg: Config, n_inputs: int) -> ParamLayout:
    """The flat layout of :func:`init_network`'s parameters, from shapes only (nothing runs)."""
    shapes = jax.eval_shape(lambda: init_network(jax.random.PRNGKey(0), cfg, n_inputs).params)
    leaves, treedef = jax.tree.flatten(shapes)
    sizes = [math.prod(leaf.shape) for leaf in leaves]
    offsets = tuple(itertools.accumulate(sizes[:-1], initial=0))
    return ParamLayout(treedef, tuple(tuple(leaf.shape) for leaf in leaves), offsets, sum(sizes))


class _Dense(nn.Module):
    """A dense layer's (kernel, bias) float32, the kernel [in, out] or with ``out_major`` [out,
    in] (:data:`HEAD`); :func:`jdqn.agent.dense_stack.dense_stack` applies them."""

    features: int
    in_features: int
    out_major: bool = False

    @nn.compact
    def __call__(self) -> tuple[jax.Array, jax.Array]:
        if self.out_major:
            shape = (self.features, self.in_features)
            init = nn.initializers.lecun_normal(-1, -2)
        else:
            shape, init = (self.in_features, self.features), nn.initializers.lecun_normal()
        kernel = self.param("kernel", init, shape, jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, (self.features,), jnp.float32)
        return kernel, bias


class C51MLP(nn.Module):
    """ReLU MLP torso with K C51 heads (Bellemare et al., 2017): logits [B, K, A, N] float32.

    The layers run as one :func:`jdqn.agent.dense_stack.dense_stack`, whose backward keeps the loss
    parts' axis inside the rows."""

    hidden: tuple[int, ...]
    n_heads: int
    n_actions: int
    n_atoms: int
    matmul_dtype: str = "float32"
    pieces: Pieces = PLAIN  # the dense stack's backward (jdqn.accel.choose)
    position_magnitude: bool = False  # append |held position| (obs[..., -1]) as an input
    # network.mirror: the inputs whose sign the mirrored price path flips (the held position,
    # obs[..., -1], besides) and action a's opposite, mirror_actions[a]; () = off
    odd_inputs: tuple[int, ...] = ()
    mirror_actions: tuple[int, ...] = ()

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        if self.mirror_actions:
            # One pass over the observation and its mirror image, the mirror's rows after.
            signs = np.ones(obs.shape[-1], np.float32)
            signs[[*self.odd_inputs, -1]] = -1.0
            obs = jnp.stack([obs, obs * signs])  # [2, ..., F+1]
        if self.position_magnitude:
            # The cost of going flat is |p| x cost: V-shaped in p, linear in |p|.
            obs = jnp.concatenate([obs, jnp.abs(obs[..., -1:])], axis=-1)
        widths = (obs.shape[-1], *self.hidden)
        torso = tuple(
            _Dense(width, widths[i], name=f"torso_{i}")() for i, width in enumerate(self.hidden)
        )
        width = self.n_heads * self.n_actions * self.n_atoms
        head = _Dense(width, widths[-1], out_major=True, name=HEAD)()
        rows = obs.reshape(-1, obs.shape[-1])  # [R, F+1], any leading axes as rows
        out = dense_stack(torso, head, rows, self.matmul_dtype, self.pieces)  # [R, K*A*N]
        logits = out.reshape(*obs.shape[:-1], self.n_heads, self.n_actions, self.n_atoms)
        if self.mirror_actions:
            # A mirrored action's return is the action's own (reward = position x move), so the
            # mirror's logits of action a's opposite join action a's: the two distributions'
            # geometric mean, renormalised, the same for an observation and its mirror.
            actions = jnp.asarray(self.mirror_actions)
            logits = 0.5 * (logits[0] + jnp.take(logits[1], actions, axis=-2))
        return logits


def module(cfg: Config, pieces: Pieces = PLAIN) -> C51MLP:
    """The linen module described by ``cfg`` (cheap to build; holds no parameters)."""
    net = cfg.network
    return C51MLP(
        hidden=tuple(net.hidden),
        n_heads=net.n_heads,
        n_actions=cfg.env.n_actions,
        n_atoms=net.n_atoms,
        matmul_dtype=net.matmul_dtype,
        pieces=pieces,
        position_magnitude=net.position_magnitude,
        odd_inputs=odd_features(cfg.data) if net.mirror else (),
        mirror_actions=_opposites(cfg.env.positions) if net.mirror else (),
    )


def _opposites(positions: tuple[float, ...]) -> tuple[int, ...]:
    """Each action's opposite: the index of ``-positions[a]`` (Config checks it exists)."""
    return tuple(positions.index(-p) for p in positions)


def torso_layers(net: NetworkConfig) -> tuple[str, ...]:
    """Names of the hidden (spectral-normalised) layers; the output head is never normalised."""
    return tuple(f"torso_{i}" for i in range(len(net.hidden)))


def atoms(net: NetworkConfig) -> jax.Array:
    """Support z_i = v_min + i * dz, [N] float32 (Bellemare et al., 2017); ``linspace`` puts
    the end atoms exactly on v_min and v_max, as the projection kernel's support."""
    return jnp.linspace(net.v_min, net.v_max, net.n_atoms, dtype=jnp.float32)


# Standard deviation of a standard normal truncated to [-2, 2]: flax's truncated ``lecun_normal``
# divides by it so the kernels' variance is 1 / fan_in.
_TRUNCATED_NORMAL_STD = 0.87962566103423978


def init_network(key: jax.Array, cfg: Config, n_inputs: int) -> NetworkState:
    """Fresh params, all-ones masks, a random unit ``u`` per torso layer (Miyato et al., 2018).

    Kernels are LeCun normal (LeCun et al., 1998) as the module declares (truncated at two
    standard deviations, variance 1 / fan_in), biases 0. All kernels come from one draw and all
    ``u`` from another: the erf-inverse behind each draw dominates the init's compile time.
    """
    k_params, k_u = jax.random.split(key)
    example = jnp.zeros((1, n_inputs), jnp.float32)
    shapes = flax.core.unfreeze(
        jax.eval_shape(lambda: module(cfg).init(jax.random.PRNGKey(0), example))["params"]
    )
    sizes = {name: math.prod(layer["kernel"].shape) for name, layer in shapes.items()}
    draws = jax.random.truncated_normal(k_params, -2.0, 2.0, (sum(sizes.values()),), jnp.float32)
    params, offset = {}, 0
    for name, layer in shapes.items():
        # Drawn as [in, out] for every layer (the head too, then transposed): the random stream
        # is as before the head's [out, in] storage.
        shape = layer["kernel"].shape
        in_out = shape[::-1] if name == HEAD else shape
        kernel = draws[offset : offset + sizes[name]].reshape(in_out)
        kernel = kernel.T if name == HEAD else kernel
        params[name] = {
            "kernel": kernel * (1.0 / math.sqrt(in_out[0]) / _TRUNCATED_NORMAL_STD),
            "bias": jnp.zeros(layer["bias"].shape, jnp.float32),
        }
        offset += sizes[name]
    masks = jax.tree.map(jnp.ones_like, params)
    sn_u: dict[str, jax.Array] = {}
    if cfg.network.spectral_norm:
        widths = [shapes[name]["kernel"].shape[1] for name in torso_layers(cfg.network)]
        normals = jax.random.normal(k_u, (sum(widths),), jnp.float32)
        starts = [sum(widths[:i]) for i in range(len(widths))]
        for name, start, width in zip(torso_layers(cfg.network), starts, widths, strict=True):
            sn_u[name] = _l2_normalise(normals[start : start + width])
    return NetworkState(params=params, masks=masks, sn_u=sn_u)


def _l2_normalise(x: jax.Array) -> jax.Array:
    return x / (jnp.linalg.norm(x) + _SN_EPS)


def spectral_normalise(
    kernel: jax.Array, u: jax.Array, mode: str
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One power iteration, then W / max(sigma, 1) or W / sigma (Miyato et al., ICLR 2018).

    ``kernel`` is flax's [in, out] (the paper's W^T); ``u`` is [out]. ``u`` and ``v`` are
    stop-gradient, so the gradient flows through sigma = u^T W v into W, as in the paper.
    Returns (normalised kernel [in, out], next u [out], sigma []).
    """
    chex.assert_rank([kernel, u], [2, 1])
    v = jax.lax.stop_gradient(_l2_normalise(jax.lax.stop_gradient(kernel) @ u))  # [in] W^T u/|.|
    wv = v @ kernel  # [out], W v (v fixed; the gradient flows into the kernel)
    # sigma = u_next^T W v with u_next = W v / |W v| is |W v|: one matrix-vector product per layer
    # instead of two, and d sigma / dW = v u_next^T, the paper's gradient. The floor keeps that
    # gradient finite for an all-zero kernel (|W v| = 0), where it would be 0/0.
    sigma = jnp.sqrt(jnp.maximum(jnp.sum(jnp.square(wv)), _SN_EPS**2))
    u_next = jax.lax.stop_gradient(wv / (sigma + _SN_EPS))  # [out] u = W v / |W v|
    scale = jnp.maximum(sigma, 1.0) if mode == "clip" else sigma
    return kernel / scale, u_next, sigma


def effective_params(
    params: Params,
    masks: Params | None,
    sn_u: dict[str, jax.Array],
    net: NetworkConfig,
    update_u: bool,
) -> tuple[Params, dict[str, jax.Array], jax.Array]:
    """Weights the forward pass uses: W * M, then spectral norm on the torso layers.

    ``update_u`` (static): ``new_u`` is the power-iterated vector (the learner step only) or the
    stored one (acting, target and auxiliary passes); sigma is the same either way, so ``act_q``
    sees the weights the next learner step would. Returns (eff_params, new_u, sigmas [L] float32
    over the torso layers; [0] without spectral norm).
    """
    eff = params if masks is None else jax.tree.map(jnp.multiply, params, masks)
    if not net.spectral_norm:
        return eff, sn_u, jnp.zeros((0,), jnp.float32)
    eff = dict(eff)
    new_u, sigmas = {}, []
    for name in torso_layers(net):
        kernel, u_next, sigma = spectral_normalise(
            eff[name]["kernel"], sn_u[name], net.spectral_mode
        )
        eff[name] = {**eff[name], "kernel": kernel}
        new_u[name] = u_next if update_u else sn_u[name]
        sigmas.append(sigma)
    return eff, new_u, jnp.stack(sigmas)


def apply(eff_params: Params, obs: jax.Array, cfg: Config, pieces: Pieces = PLAIN) -> jax.Array:
    """Logits [..., K, A, N] float32 for observations [..., F+1] with effective parameters;
    ``pieces`` picks the backward's form (the forward is the same)."""
    return cast(jax.Array, module(cfg, pieces).apply({"params": eff_params}, obs))


def q_values(logits: jax.Array, support: jax.Array) -> jax.Array:
    """Q = sum_i softmax(logits)_i z_i in float32 (Bellemare et al., 2017). [..., N] -> [...]."""
    chex.assert_type(support, jnp.float32)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.sum(probs * support, axis=-1)


# ----------------------------------------------------------------------------- pruning


def prune_sparsity(step: jax.Array, net: NetworkConfig) -> jax.Array:
    """Cubic schedule s_t = s * (1 - (1 - progress)^3) (Zhu & Gupta, 2017). [] float32."""
    step = jnp.asarray(step, jnp.float32)
    span = net.prune_end - net.prune_start
    if span == 0:
        progress = (step >= net.prune_start).astype(jnp.float32)
    else:
        progress = jnp.clip((step - net.prune_start) / span, 0.0, 1.0)
    return jnp.float32(net.target_sparsity) * (1.0 - (1.0 - progress) ** 3)


def prune_due(step: jax.Array, net: NetworkConfig) -> jax.Array:
    """Whether the masks are recomputed at ``step``: every prune_every steps inside the window,
    and at prune_end so the final sparsity is reached exactly. [] bool."""
    in_window = (step >= net.prune_start) & (step <= net.prune_end)
    on_period = ((step - net.prune_start) % net.prune_every == 0) | (step == net.prune_end)
    return in_window & on_period


def magnitude_masks(params: Params, sparsity: jax.Array) -> Params:
    """Layer-wise magnitude masks: the floor(s * size) smallest |W| of each kernel are zeroed.

    Ranks (not a threshold) decide, so ties cannot prune more than asked; already-pruned zeros
    rank lowest and stay pruned while the schedule only grows. Biases are never pruned.
    """

    def layer_mask(layer: dict[str, jax.Array]) -> dict[str, jax.Array]:
        kernel = layer["kernel"]
        n_prune = jnp.floor(sparsity * kernel.size).astype(jnp.int32)
        ranks = jnp.argsort(jnp.argsort(jnp.abs(kernel).ravel()))  # [in*out] int32, 0 = smallest
        mask = (ranks >= n_prune).astype(jnp.float32).reshape(kernel.shape)
        return {**{k: jnp.ones_like(v) for k, v in layer.items()}, "kernel": mask}

    return {name: layer_mask(layer) for name, layer in params.items()}


def mask_sparsity(masks: Params) -> jax.Array:
    """Fraction of kernel entries pruned, over all layers. [] float32."""
    zeros = cast(jax.Array, sum(jnp.sum(layer["kernel"] == 0) for layer in masks.values()))
    total = sum(layer["kernel"].size for layer in masks.values())
    return zeros.astype(jnp.float32) / total


# ----------------------------------------------------------------------------- ensemble


def bootstrap_masks(key: jax.Array, serials: jax.Array, n_heads: int, prob: float) -> jax.Array:
    """Bernoulli(prob) head masks per transition (Osband et al., 2016), [B, K] float32.

    Keyed on each transition's insertion serial (``jdqn.agent.replay.replay_serials``): a stored
    transition keeps one mask for life without widening the record; its slot's next occupant
    draws a new one.
    """
    draw = lambda serial: jax.random.bernoulli(jax.random.fold_in(key, serial), prob, (n_heads,))
    return jax.vmap(draw)(serials).astype(jnp.float32)
