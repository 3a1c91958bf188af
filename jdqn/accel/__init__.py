"""The learner's one seam for speed: how the update (gradient surgery, Adam, masks, target sync
and the guard's keep-or-reject; docs/design.md, section 5, steps 7-8 and 10-11) runs.

:func:`choose` describes each piece's implementation once (:class:`Pieces`); the step calls the
update :func:`make_update` builds for ``Pieces.tail`` and never asks which. Both forms take and
return the state in its one form (parameter trees, optax's Adam state) and agree to float32
rounding:

- ``xla``: :func:`jdqn.agent.surgery.gradient_surgery` on the ``[parts, n_params]`` gradient and
  optax's Adam, as jnp that XLA fuses. Fastest for few learners.
- ``pallas`` (``pallas_kernels.flat_tail``; ``interpret`` on a CPU): the surgery's reductions in
  one Pallas kernel, then Adam, masks, sync and the guard's select in two kernels that write
  the state in place. Pays from :data:`FUSED_TAIL_MIN_LEARNERS` vmapped learners on a GPU,
  where the tail is memory-bound; the causal term then runs under a ``lax.cond``
  (``Pieces.fused_tail``), where with XLA's few learners a 0/1 weight is cheaper.

Users choose with ``accel.kernels`` (``auto`` or ``off``); tests and benchmarks force single
pieces with ``accel.pieces``; :class:`Pieces` is passed down to the losses, the dense stack and
the step as a static argument.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jdqn.accel.pieces import Pieces
from jdqn.agent import surgery
from jdqn.config import Config
from pallas_kernels import flat_tail

if TYPE_CHECKING:  # jdqn.agent.networks imports jdqn.accel.pieces, which runs this file first
    from jdqn.agent.networks import ParamLayout, Params

# From this many vmapped learners on, accel.kernels=auto uses the Pallas flat tail.
FUSED_TAIL_MIN_LEARNERS = 16

# Adam's decay rates (Kingma & Ba, ICLR 2015; optax's defaults), shared by both updates.
ADAM_B1, ADAM_B2 = 0.9, 0.999


class TailState(NamedTuple):
    """The learner state's vectors the update reads (one learner; trees of the parameters')."""

    params: Params  # online parameters as stored (unmasked)
    target_params: Params
    masks: Params | None  # this step's pruning masks; None without pruning (all ones)
    opt_state: optax.OptState  # the update's state (:func:`adam_init`)


class SurgeryInputs(NamedTuple):
    """The gradient surgery's settings for this step (docs/design.md, section 5, steps 7-8)."""

    phi_hat: jax.Array  # [] float32, the vaccine's cosine EMA
    beta: float  # the EMA's rate
    vaccine_due: jax.Array  # [] bool
    shares: tuple[jax.Array, jax.Array]  # budget shares of the MSE and C51 parts
    budget: float


class Update(NamedTuple):
    """The update of one step, already kept or rejected by the guard."""

    state: TailState  # params, target, opt_state kept (masks as given)
    surgery: Any  # SurgeryResult or SurgeryScalars: the metrics read fields both have
    gradient_finite: jax.Array  # [] bool, every part's gradient and their total are finite
    params_sq_norm: jax.Array  # [] float32, the candidate parameters' squared norm


def choose(cfg: Config, *, backend: str, debug: bool, learners: int) -> Pieces:
    """Each piece's implementation for ``learners`` learners stepped by one program on
    ``backend``: ``accel.pieces`` where it forces one, else ``accel.kernels``'s choice. ``auto``
    runs the projection's kernel on a GPU, and the flat tail's from
    :data:`FUSED_TAIL_MIN_LEARNERS` learners on outside debug mode (whose checks read vectors
    the kernels never write); ``off`` runs plain XLA."""
    forced = cfg.accel.forced
    on_gpu = backend == "gpu" and cfg.accel.kernels == "auto"
    fused = on_gpu and not debug and learners >= FUSED_TAIL_MIN_LEARNERS
    auto = {
        "projection": "pallas" if on_gpu else "reference",
        "tail": "pallas" if fused else "xla",
        "dense": "custom",
        "vjp": "closed",
        "barriers": "on",
        "executables": "on",
    }
    resolved = {k: auto[k] if forced.get(k, "auto") == "auto" else forced[k] for k in auto}
    switches = {k: resolved[k] == "on" for k in ("barriers", "executables")}
    return Pieces(**{**resolved, **switches})  # type: ignore[arg-type]  # values from PIECES


def make_update(pieces: Pieces, cfg: Config, layout: ParamLayout) -> Callable[..., Update]:
    """The update ``(grads: tree of [parts, ...], old: TailState, inputs: SurgeryInputs,
    pre_ok [] bool, sync [] bool, learning_rate [] float32, checks) -> Update`` in
    ``pieces.tail``'s form. The learning rate is a value (``jdqn.agent.state.Hyper``), so that
    learners of one program may differ in it."""
    o = cfg.optim
    if not pieces.fused_tail:
        return _xla_update(o.adam_eps, layout, o.tau, pieces)
    hyper = flat_tail.AdamHyper(ADAM_B1, ADAM_B2, o.adam_eps, o.tau)
    kernel_impl: flat_tail.Impl = "interpret" if pieces.tail == "interpret" else "pallas"
    return _kernel_update(hyper, kernel_impl, layout)


def adam_init(cfg: Config, params: Params) -> optax.OptState:
    """The update's state for ``params``, one form for either update: optax.adam's (zero moments
    over the tree, count 0), then the flat tail's :class:`~pallas_kernels.flat_tail.TailBounds`
    (max |x| of params, mu and nu as its kernels last wrote them; unknown after XLA's update),
    which let its next step skip the guard's sums where they cannot fail."""
    o = cfg.optim
    adam = optax.adam(o.learning_rate, b1=ADAM_B1, b2=ADAM_B2, eps=o.adam_eps).init(params)
    return (*adam, flat_tail.unknown_bounds())


def all_finite(tree: Any) -> jax.Array:
    """Whether every entry of every leaf is finite: one reduction over the concatenated leaves
    (XLA fuses the concatenation), not one kernel per leaf."""
    return jnp.all(jnp.isfinite(jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(tree)])))


def select(ok: jax.Array, new: Any, old: Any) -> Any:
    """``new`` where ``ok``, else ``old``, leaf by leaf."""
    return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)


def masked(params: Params, masks: Params | None) -> Params:
    """``params * masks``; ``params`` itself without pruning."""
    return params if masks is None else jax.tree.map(jnp.multiply, params, masks)


def _xla_update(eps: float, layout: ParamLayout, tau: float, pieces: Pieces) -> Any:
    def update(
        grads: Params,
        old: TailState,
        inputs: SurgeryInputs,
        pre_ok: jax.Array,
        sync: jax.Array,
        learning_rate: jax.Array,
        checks: Any,
    ) -> Update:
        flat = jax.vmap(layout.ravel)(grads)  # [parts, n_params]
        with jax.named_scope("surgery"):
            result = surgery.gradient_surgery(flat, *inputs)
        checks.finite("surgery", "grad_mse", result.g1)
        checks.finite("surgery", "grad_c51", result.g2)
        # On CPU the total is materialised before Adam, as the debug checks of it force: fused
        # into Adam's loop it rounds differently (contracted multiply-adds), and a --debug run
        # would no longer reproduce the plain run bit for bit.
        total = jax.lax.platform_dependent(
            result.total, cpu=lambda total: pieces.barrier(total), default=lambda total: total
        )
        checks.finite("gradient", "grad_total", total)
        with jax.named_scope("adam"):
            params = masked(old.params, old.masks)
            adam_state = old.opt_state[:-1]  # optax.adam's, without the flat tail's bounds
            optimizer = optax.adam(learning_rate, b1=ADAM_B1, b2=ADAM_B2, eps=eps)
            updates, opt_state = optimizer.update(layout.unravel(total), adam_state, params)
            checks.finite_norm("adam", "update", updates)
            new_params = masked(optax.apply_updates(params, updates), old.masks)
            checks.finite_norm("adam", "new_params", new_params)
        with jax.named_scope("target_sync"):
            if tau > 0:
                target = jax.tree.map(
                    lambda t, p: (1.0 - tau) * t + tau * p, old.target_params, new_params
                )
            else:
                target = select(sync, new_params, old.target_params)
        # max |g| is NaN/inf exactly when a part's gradient is: no pass over the gradients.
        gradient_finite = all_finite(result.row_max) & all_finite(total)
        # Finite exactly when every new parameter is and the squared norm does not overflow.
        sq_norm = sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(new_params))
        ok = pre_ok & gradient_finite & jnp.isfinite(sq_norm)
        params, target, opt_state = select(
            ok, (new_params, target, opt_state), (old.params, old.target_params, adam_state)
        )
        opt_state = (*opt_state, flat_tail.unknown_bounds())
        state = TailState(params, target, old.masks, opt_state)
        return Update(state, result, gradient_finite, jnp.asarray(sq_norm, jnp.float32))

    return update


def _kernel_update(hyper: flat_tail.AdamHyper, impl: flat_tail.Impl, layout: ParamLayout) -> Any:
    def segments(tree: Params | None) -> tuple[jax.Array, ...] | None:
        return None if tree is None else tuple(x.reshape(-1) for x in jax.tree.leaves(tree))

    def update(
        grads: Params,
        old: TailState,
        inputs: SurgeryInputs,
        pre_ok: jax.Array,
        sync: jax.Array,
        learning_rate: jax.Array,
        checks: Any,
    ) -> Update:
        del checks  # debug mode runs the XLA update (the kernels write no intermediates)
        rows = [g.reshape(g.shape[0], -1) for g in jax.tree.leaves(grads)]  # [parts, n_k]
        with jax.named_scope("surgery"):
            row_max, gram = flat_tail.gram(tuple(rows), impl=impl)
            scalars = surgery.surgery_scalars(row_max, gram, *inputs)
        parts_finite = all_finite(row_max)  # max |g| is NaN exactly when a row is non-finite
        adam, *rest, bounds = old.opt_state
        count = optax.safe_increment(adam.count)
        trees = (old.params, old.masks, old.target_params, adam.mu, adam.nu)
        with jax.named_scope("adam"):
            tail = flat_tail.adam_select(
                tuple(rows),
                scalars.weights,
                flat_tail.TailVectors(*map(segments, trees)),
                flat_tail.TailScalars(
                    bias1=1 - hyper.b1**count,
                    bias2=1 - hyper.b2**count,
                    pre_ok=pre_ok & parts_finite,
                    sync=sync,
                    lr=learning_rate,
                ),
                hyper,
                impl=impl,
                bounds=bounds,
                row_max=row_max,
            )
        gradient_finite = parts_finite & tail.total_finite
        applied = pre_ok & gradient_finite & jnp.isfinite(tail.params_sq_norm)
        opt_state = (
            adam._replace(
                count=jnp.where(applied, count, adam.count),
                mu=layout.tree(tail.mu),
                nu=layout.tree(tail.nu),
            ),
            *rest,
            tail.bounds,
        )
        state = TailState(layout.tree(tail.params), layout.tree(tail.target), old.masks, opt_state)
        # Only the main parts' weights (the others' are 1): the same shapes whatever the number
        # of parts, as the causal term's branch (jdqn.agent.step) needs.
        scalars = scalars._replace(weights=scalars.weights[:2])
        return Update(state, scalars, gradient_finite, tail.params_sq_norm)

    return update
