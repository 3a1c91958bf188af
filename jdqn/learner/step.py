"""The learner step: one pure function, jit-compiled with donated state (DESIGN section 5).

``make_learner(cfg, n_features, non_causal)`` returns a :class:`Learner` of four pure functions
over :class:`LearnerState`:

- ``init(key) -> LearnerState`` (empty replay buffer),
- ``insert(state, transitions [n]) -> LearnerState`` (PER insert at max priority),
- ``step(state, alpha, beta, clock=None) -> (LearnerState, LearnerMetrics)``: every step of
  DESIGN section 5 in order, guard included,
- ``act_q(state, obs [B, F+1]) -> [B, A]``: head-mean Q of the online net (stored ``u``, never
  updated).

All four are ``jax.jit``-able (``step`` with ``donate_argnums=0``) and ``jax.vmap``-able over a
leading seed/fold axis of the state. Periodic parts (vaccine, causal term, pruning, target sync)
are selects or ``lax.cond`` on the traced step counter, never Python branches on traced values.
Python branches exist only on the static config (a component that is off costs nothing).

Under ``vmap`` the state's step counter is batched, so a ``lax.cond`` on it becomes a select that
runs both branches. ``clock`` is the same counter given unbatched, for programs whose learners
step in lock-step (every caller in jdqn that vmaps learners): the schedules then follow it, and
with the Pallas tail the causal term runs under a real ``lax.cond``, only on the steps it is due.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jdqn import debug as debug_mode
from jdqn import kernel_choice, losses, networks
from jdqn.config import Config
from jdqn.donors import make_donors, n_donors_for
from jdqn.learner.state import GuardRecord, Learner, LearnerMetrics, LearnerState
from jdqn.replay import (
    replay_add,
    replay_init,
    replay_sample,
    replay_serials,
    replay_update,
)
from jdqn.surgery import SurgeryResult, SurgeryScalars, budget_shares, gradient_surgery
from jdqn.surgery import surgery_scalars as gradient_surgery_scalars
from jdqn.transition import Transition, example_transition, observation
from pallas_kernels import double_dqn, flat_tail

# From this many vmapped learners on, optim.update_impl=auto uses the Pallas flat tail.
FUSED_TAIL_MIN_LEARNERS = 16

# From this many vmapped learners on, loss.pick_impl=auto uses the double-DQN pick kernel.
PICK_KERNEL_MIN_LEARNERS = 16

# Adam's decay rates (Kingma & Ba, ICLR 2015; optax's defaults), shared by optax's update and
# the fused tail kernel.
ADAM_B1, ADAM_B2 = 0.9, 0.999

# Named scopes of the step's parts (``jax.named_scope``), as they appear in the op metadata of
# the compiled program; ``jdqn.bench.kernels`` attributes each kernel to one of them.
SCOPES = (
    "per_sample",
    "donors",
    "target_net",
    "online_forward",
    "projection",
    "losses",
    "surgery",
    "adam",
    "target_sync",
    "per_update",
    "guard",
    "metrics",
)


def _all_finite(tree: Any) -> jax.Array:
    # One reduction over the concatenated leaves (XLA fuses the concatenation into it), not one
    # reduction kernel per leaf.
    return jnp.all(jnp.isfinite(jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(tree)])))


def _with_part(grads: jax.Array | flat_tail.Segments, row: Any) -> Any:
    """The loss parts' gradients with one more part ``row``, in the same form: the ``[parts,
    n_params]`` matrix, or its per-layer column segments (then ``row`` is segments too)."""
    if isinstance(grads, tuple):
        return tuple(jnp.concatenate([g, r[None]]) for g, r in zip(grads, row, strict=True))
    return jnp.concatenate([grads, row[None]])


def _part(grads: jax.Array | flat_tail.Segments, k: int) -> Any:
    """Part ``k``'s gradient, as the matrix's row or the segments' rows."""
    return tuple(g[k] for g in grads) if isinstance(grads, tuple) else grads[k]


def _select(ok: jax.Array, new: Any, old: Any) -> Any:
    return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)


def resolve_update_impl(impl: str, backend: str, *, debug: bool, learners: int) -> str:
    """``optim.update_impl`` as the step builds it: ``"auto"`` is the Pallas flat tail
    (``pallas_kernels.flat_tail``) on a GPU for programs that step at least
    :data:`FUSED_TAIL_MIN_LEARNERS` learners together, and XLA otherwise: on the H200 the kernels
    made 16 / 128 / 1,024 vmapped learners 2.6 / 7.7 / 3.1 % faster and one learner 8.9 % slower
    under CONCURRENT command buffers (BENCHMARKS.md, "H2"). Debug mode keeps XLA: its checks read
    the surgery's and Adam's intermediate vectors, which the kernels never write."""
    if impl != "auto":
        return impl
    fused = backend == "gpu" and not debug and learners >= FUSED_TAIL_MIN_LEARNERS
    return "pallas" if fused else "xla"


def resolve_pick_impl(impl: str, backend: str, *, learners: int) -> str:
    """``loss.pick_impl`` as the step builds it: ``"auto"`` is the Pallas kernel
    (``pallas_kernels.double_dqn``) on a GPU for programs that step at least
    :data:`PICK_KERNEL_MIN_LEARNERS` learners together, and XLA's fusions otherwise: on the
    H200 the kernel made 16 / 128 / 1,024 vmapped learners 3.5 / 4.6 / 3.8 % faster (A4) and
    one learner 4.9 % slower (A3; BENCHMARKS.md, "Eighteenth session")."""
    if impl != "auto":
        return impl
    return "pallas" if backend == "gpu" and learners >= PICK_KERNEL_MIN_LEARNERS else "xla"


def make_learner(
    cfg: Config,
    n_features: int,
    non_causal: tuple[int, ...],
    debug: bool = False,
    learners: int = 1,
) -> Learner:
    """Build the learner for ``n_features`` feature columns (observations have one more: the
    position). ``non_causal`` lists the feature columns the causal intervention permutes.
    ``debug`` puts value checks (``jdqn.debug``) at each component boundary, to be run under
    ``jdqn.debug.checked``; off, the checks are absent from the compiled program. ``learners``
    is how many learners one program will step together under ``vmap`` (folds x seeds); it
    only picks the flat tail's implementation (:func:`resolve_update_impl`)."""
    non_causal = tuple(int(i) for i in non_causal)
    if any(not 0 <= i < n_features for i in non_causal) or len(set(non_causal)) != len(non_causal):
        raise ValueError(
            f"non_causal: {non_causal} must be distinct feature columns in [0, {n_features}); "
            "the position column is never intervened on"
        )
    net, loss_cfg = cfg.network, cfg.loss
    n_actions, n_heads = cfg.env.n_actions, net.n_heads
    batch_size = cfg.train.batch_size
    n_donors = n_donors_for(batch_size, loss_cfg.donor_fraction, loss_cfg.donor_mode, n_actions)
    positions = jnp.asarray(cfg.env.positions, jnp.float32)  # [A]
    support = networks.atoms(net)  # [N]
    optimizer = optax.adam(cfg.optim.learning_rate, b1=ADAM_B1, b2=ADAM_B2, eps=cfg.optim.adam_eps)
    kernels = kernel_choice.kernels_for(cfg.accel)
    update_impl = resolve_update_impl(
        kernels.tail, jax.default_backend(), debug=debug, learners=learners
    )
    fused_tail = update_impl != "xla"
    # With the Pallas tail the parameters and the target are stored as their leaves' segments
    # (ParamLayout.split), which the kernels read and write in place: the network's GEMMs read
    # a segment as it is, where a slice of the flat vector was a copy before each GEMM (the head
    # kernel's: ~21 us for each net at 1,024 learners; BENCHMARKS.md, D5). On the H200 1,024
    # learners went from 1,258 to 1,148 us a step (-8.7 %, F5). XLA's tail keeps them flat: its
    # update is then a few passes over one vector (ParamLayout).
    pick_impl = resolve_pick_impl(kernels.pick, jax.default_backend(), learners=learners)
    pick_kernel: double_dqn.Impl = "interpret" if pick_impl == "interpret" else "pallas"
    tail_impl: flat_tail.Impl = "interpret" if update_impl == "interpret" else "pallas"
    adam_hyper = flat_tail.AdamHyper(
        ADAM_B1, ADAM_B2, cfg.optim.adam_eps, cfg.optim.learning_rate, cfg.optim.tau
    )
    use_diversity = n_heads > 1 and net.lambda_div > 0
    use_causal = len(non_causal) > 0 and loss_cfg.causal_weight > 0
    use_pruning = net.target_sparsity > 0
    # With the Pallas tail (many learners) the causal part is pulled back through the spectral
    # norm on its own instead of stacked with the main parts first: on the H200 16 / 128 / 1,024
    # learners 7 / 7 / 3.4 % faster; with XLA's tail one learner was 9 us slower (its second
    # pull-back's kernels; BENCHMARKS.md, Y10-Y11). Only without the diversity term: with it the
    # causal part is added to the third part anyway.
    separate_causal = use_causal and not use_diversity and fused_tail
    # Without pruning the masks stay all ones (init). Multiplying by ones is exact, yet with the
    # Pallas tail (many learners) each step read the [L, n_params] masks in several passes (the
    # effective weights, the target's, the backward pass, both Adam kernels): not reading them
    # took S = 1,024 from 2,625 to 2,558 us per step. On XLA's tail (the default
    # below 16 learners) the product stays: it is the kernel XLA fuses the flat vector's slices
    # into, and without it one learner's step had 8 more kernels, 97.3-97.8 -> 100.2 us
    # (BENCHMARKS.md, "Thirteenth session", W3-W4). Skipping them changes a value only where
    # the compiler contracts a multiply-add differently, by at most 1 ulp.
    read_masks = use_pruning or not fused_tail
    use_bootstrap = n_heads > 1 and net.bootstrap_prob < 1
    # Debug checks on Q allow float32 rounding of sum_i p_i z_i (p sums to 1 within ~1e-6).
    q_slack = 1e-4 * (net.v_max - net.v_min)
    q_low, q_high = net.v_min - q_slack, net.v_max + q_slack
    layout = networks.param_layout(cfg, n_features + 1)

    def masked(vector: Any, masks: jax.Array | None) -> Any:
        """``vector`` (flat, or its leaves' segments) times the flat ``masks``; ``vector``
        itself when the masks are not read (all ones: no pruning)."""
        if masks is None:
            return vector
        if isinstance(vector, tuple):
            return tuple(x * m for x, m in zip(vector, layout.split(masks), strict=True))
        return vector * masks

    def init(key: jax.Array) -> LearnerState:
        net_key, state_key, bootstrap_key = jax.random.split(key, 3)
        network = networks.init_network(net_key, cfg, n_features + 1)
        params = layout.ravel(network.params)
        stored = layout.split(params) if fused_tail else params
        return LearnerState(
            params=stored,
            target_params=jax.tree.map(jnp.copy, stored),
            sn_u=network.sn_u,
            masks=layout.ravel(network.masks),
            opt_state=optimizer.init(params),
            phi_hat=jnp.zeros((), jnp.float32),
            replay=replay_init(cfg.replay.capacity, example_transition(n_features)),
            step=jnp.zeros((), jnp.int32),
            guard=GuardRecord(
                halted=jnp.zeros((), bool),
                step=jnp.full((), -1, jnp.int32),
                reason=jnp.zeros((), jnp.int32),
            ),
            key=state_key,
            bootstrap_key=bootstrap_key,
            tail_bounds=flat_tail.unknown_bounds(),
        )

    def insert(state: LearnerState, transitions: Transition) -> LearnerState:
        return state.replace(replay=replay_add(state.replay, transitions))  # type: ignore[attr-defined]  # flax.struct adds .replace

    def act_q(state: LearnerState, obs: jax.Array) -> jax.Array:
        eff, _, _ = networks.effective_params(
            layout.unravel(masked(state.params, state.masks)), None, state.sn_u, net, False
        )
        return jnp.mean(networks.q_values(networks.apply(eff, obs, cfg), support), axis=-2)

    def step(
        state: LearnerState, alpha: jax.Array, beta: jax.Array, clock: jax.Array | None = None
    ) -> tuple[LearnerState, LearnerMetrics]:
        """One learner step. ``clock``: ``state.step`` as an unbatched int, shared by every
        learner a vmapped program steps (they start together and step in lock-step); the
        schedules (vaccine, causal term, pruning, target sync) follow it. None: they follow
        ``state.step``."""
        alpha = jnp.asarray(alpha, jnp.float32)
        beta = jnp.asarray(beta, jnp.float32)
        schedule = state.step if clock is None else jnp.asarray(clock, jnp.int32)
        key, sample_key, donor_key, causal_key, bootstrap_key = jax.random.split(state.key, 5)
        checks = debug_mode.boundaries(debug, state.step)  # no-ops when debug is off
        # Checked as trees, so a failure names the layer.
        checks.finite("learner_state", "params", layout.unravel(state.params))
        checks.finite("learner_state", "target_params", layout.unravel(state.target_params))
        if clock is not None:  # the schedules follow the clock: it must be the own counter
            offset = (state.step - schedule).astype(jnp.float32)
            checks.within("learner_state", "step_minus_clock", offset, 0.0, 0.0)

        # 1. PER sample: stratified proportional, IS weights normalised by their max.
        with jax.named_scope("per_sample"):
            indices, sampled, is_weights = replay_sample(
                state.replay, sample_key, batch_size, cfg.replay.alpha, beta
            )
        # 2. HER donors: other actions at the same bar; IS weight 1; never write priorities.
        with jax.named_scope("donors"):
            if n_donors > 0:
                donors = make_donors(
                    donor_key,
                    sampled,
                    positions,
                    cfg.env.cost_points,
                    cfg.env.reward_scale,
                    loss_cfg.donor_mode,
                    n_donors,
                )
                batch = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), sampled, donors)
                row_weights = jnp.concatenate([is_weights, jnp.ones((n_donors,), jnp.float32)])
            else:
                batch, row_weights = sampled, is_weights
        n_rows = batch_size + n_donors
        obs = observation(batch.features, batch.position)  # [R, F+1]
        next_obs = observation(batch.next_features, positions[batch.action])  # [R, F+1]
        discounts = loss_cfg.gamma * (1.0 - batch.done)  # [R] float32
        checks.within("replay", "is_weights", is_weights, 0.0, 1.0)
        checks.finite("batch", "observation", obs)
        checks.finite("batch", "next_observation", next_obs)
        checks.finite("batch", "reward", batch.reward)
        checks.finite("batch", "price_change", batch.price_change)
        if use_bootstrap:
            # [R, K]: one mask per stored transition for its whole life (keyed on its insertion
            # serial, so an overwritten slot gets a fresh draw), fresh for donors.
            head_masks = jnp.concatenate(
                [
                    networks.bootstrap_masks(
                        state.bootstrap_key,
                        replay_serials(state.replay, indices),
                        n_heads,
                        net.bootstrap_prob,
                    ),
                    networks.bootstrap_masks(
                        bootstrap_key, jnp.arange(n_donors), n_heads, net.bootstrap_prob
                    ),
                ]
            )
        else:
            head_masks = jnp.ones((n_rows, n_heads), jnp.float32)
        row_head_weights = row_weights[:, None] * head_masks  # [R, K]

        # 3. Effective weights: pruning masks (recomputed on schedule), then spectral norm.
        masks: jax.Array | None = state.masks if read_masks else None
        if use_pruning:
            masks = jax.lax.cond(
                networks.prune_due(schedule, net),
                lambda: layout.ravel(
                    networks.magnitude_masks(
                        layout.unravel(state.params), networks.prune_sparsity(schedule, net)
                    )
                ),
                lambda: state.masks,
            )
        params = masked(state.params, masks)  # [n_params] or leaves, pruned entries exactly 0
        with jax.named_scope("target_net"):
            target_eff, _, _ = networks.effective_params(
                layout.unravel(masked(state.target_params, masks)), None, state.sn_u, net, False
            )
            # [R, K, A, N]; for the pick kernel the head's GEMM and its bias apart.
            if pick_impl == "xla":
                target_logits_next = networks.apply(target_eff, next_obs, cfg)
            else:
                target_gemm_next, target_bias = networks.apply_without_head_bias(
                    target_eff, next_obs, cfg
                )
                target_logits_next = target_gemm_next + target_bias  # for the check only
        checks.finite("target_network", "logits_next", target_logits_next)

        # 3 (cont.). The effective weights and their VJP: the loss chains below differentiate
        # with respect to the effective weights, and one batched pull-back through the mask and
        # the spectral norm turns those cotangents into the flat parameter gradients.
        def effective(p: Any) -> tuple[Any, tuple[dict[str, jax.Array], jax.Array]]:
            """The effective weights of ``p``, flat or its leaves' segments: differentiated
            with respect to the segments, the pull-back gives each leaf's gradient apart, with
            no [n_params] vector assembled. The mask inside the differentiated function:
            pruned entries get zero gradient."""
            tree = layout.unravel(masked(p, masks))
            eff, new_u, sigmas = networks.effective_params(tree, None, state.sn_u, net, True)
            return eff, (new_u, sigmas)

        with jax.named_scope("online_forward"):
            # params as stored: flat, or with the Pallas tail its leaves' segments.
            eff, pull_back, (new_u, sigmas) = jax.vjp(effective, params, has_aux=True)
            # s' only picks a* for the (stop-gradient) target: a forward pass, outside every VJP.
            if pick_impl == "xla":
                logits_next = networks.apply(eff, next_obs, cfg)  # [R, K, A, N]
            else:
                gemm_next, bias = networks.apply_without_head_bias(eff, next_obs, cfg)
                logits_next = gemm_next + bias  # for the check only
        checks.finite("spectral_norm", "u", new_u)
        checks.finite("online_network", "logits_next", logits_next)

        # 4. Double-DQN target, projection, label smoothing; no gradient flows into it.
        with jax.named_scope("projection"):
            if pick_impl == "xla":
                q_next = networks.q_values(logits_next, support)  # [R, K, A]
                _, probs_star, q_star = losses.double_dqn_target(
                    q_next, target_logits_next, support
                )
            else:  # one kernel reads both nets' head outputs once (BENCHMARKS.md, A1-A5)
                q_next, probs_star, q_star = double_dqn.double_dqn_pick(
                    gemm_next, bias, target_gemm_next, target_bias, support, impl=pick_kernel
                )
            checks.distribution("target_network", "probs_star", probs_star, 1e-4)
            checks.within("online_network", "q_next", q_next, q_low, q_high)
            checks.within("target_network", "q_star", q_star, q_low, q_high)
            rewards_k = jnp.broadcast_to(batch.reward[:, None], (n_rows, n_heads))  # [R, K]
            discounts_k = jnp.broadcast_to(discounts[:, None], (n_rows, n_heads))  # [R, K]
            projected = losses.project_target(
                probs_star.reshape(n_rows * n_heads, -1),
                rewards_k.reshape(-1),
                discounts_k.reshape(-1),
                net.v_min,
                net.v_max,
                impl=kernels.projection,
            ).reshape(n_rows, n_heads, -1)  # [R, K, N]
        checks.distribution("projection", "projected_target", projected, 1e-4)
        target = jax.lax.stop_gradient(losses.label_smooth(projected, loss_cfg.label_smoothing))
        checks.distribution("label_smoothing", "target", target, 1e-4)
        y = jax.lax.stop_gradient(
            losses.scalar_target(rewards_k, discounts_k, q_star, net.v_min, net.v_max)
        )  # [R, K]
        checks.within("scalar_target", "y", y, net.v_min, net.v_max)

        def observed(e: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
            """(L_mse, L_c51, L_div) [3] of the online pass over s (sampled rows and donors)."""
            with jax.named_scope("online_forward"):
                logits = networks.apply(e, obs, cfg)  # [R, K, A, N] float32
            checks.finite("online_network", "logits", logits)
            # For the check and as the causal term's fixed reference; the same operation on the
            # same logits as c51_head's own, so XLA computes it once (common subexpressions).
            log_probs = jax.nn.log_softmax(logits, axis=-1)  # [R, K, A, N]
            checks.within("online_network", "log_probs", log_probs, -math.inf, 0.0)

            # 5. Loss parts, IS- and bootstrap-weighted means over (row, head).
            with jax.named_scope("losses"):
                # Q of every action and the taken action's C51 cross-entropy from one
                # log-softmax, with their gradient in closed form (losses.c51_head); the taken
                # action's Q by select. Both parts' gradients then take one elementwise pass.
                action = batch.action[:, None]  # [R, 1], broadcast over the heads
                q, c51_parts = losses.c51_head(logits, support, action, target)  # [R, K, A], [R, K]
                q_taken = losses.select_action(q, action)  # [R, K]
                mse_parts = losses.q_regression_loss(
                    q_taken, y, net.v_min, net.v_max, loss_cfg.huber_delta
                )  # [R, K]
                checks.within("online_network", "q", q, q_low, q_high)
                loss_mse = jnp.mean(row_head_weights * mse_parts)
                loss_c51 = jnp.mean(row_head_weights * c51_parts)
                loss_div = (
                    losses.ensemble_diversity(q, net.lambda_div)
                    if use_diversity
                    else jnp.float32(0)
                )
            checks.finite("loss", "loss_mse", loss_mse)
            checks.finite("loss", "loss_c51", loss_c51)
            checks.finite("loss", "loss_div", loss_div)
            aux = {"log_probs": log_probs, "q": q, "q_taken": q_taken}
            return jnp.stack([loss_mse, loss_c51, loss_div]), aux

        def intervened(e: Any, reference: jax.Array) -> jax.Array:
            """Mean KL(p(s) || p(do(s))) of the online pass over do(s); ``reference`` is the
            (stop-gradient) log-softmax of s for the same sampled rows."""
            causal_obs = losses.causal_intervention(causal_key, obs[:batch_size], non_causal)
            with jax.named_scope("online_forward"):
                logits_do = networks.apply(e, causal_obs, cfg)  # [B, K, A, N]
            checks.finite("online_network", "logits_intervened", logits_do)
            with jax.named_scope("losses"):
                loss = jnp.mean(losses.causal_kl(reference, logits_do))
            checks.finite("loss", "loss_causal", loss)
            return loss

        # 6. The gradients of the parts separately (surgery needs them, value_and_grad of the
        # blend would give only their sum), as two chains: s rows with a batched VJP over the
        # cotangents that pick (1-alpha) L_mse, alpha L_c51 (and L_div), and do(s) rows with
        # one VJP for the causal term. One chain over both row sets ran every cotangent over
        # every row: 3 x 144 rows at the smoketest against 2 x 80 + 64 now.
        main_parts, observed_vjp, aux = jax.vjp(observed, eff, has_aux=True)
        q, q_taken = aux["q"], aux["q_taken"]
        n_main = 3 if use_diversity else 2
        main_cotangents = jnp.zeros((n_main, 3), jnp.float32)
        main_cotangents = main_cotangents.at[0, 0].set(1.0 - alpha).at[1, 1].set(alpha)
        if use_diversity:
            main_cotangents = main_cotangents.at[2, 2].set(1.0)
        (eff_grads,) = jax.vmap(observed_vjp)(main_cotangents)  # tree, leaves [n_main, ...]
        # 9. The causal term enters only every causal_every steps. Given a clock, with the
        # Pallas tail and without the diversity term (whose part the causal one joins), it
        # runs under a cond below, only when due: its do(s) pass, backward and gradient row
        # were 21 % of a 1,024-learner step that used it once in 50 (BENCHMARKS.md, Z1-Z2).
        # Otherwise it is computed at every step and switched by a 0/1 factor on its
        # cotangent: a cond on the batched step counter would run both branches under vmap,
        # and one learner's launch-bound step would save 5 us at most (Z1).
        causal_due = schedule % loss_cfg.causal_every == 0
        causal_on = causal_due.astype(jnp.float32)
        cond_causal = separate_causal and clock is not None

        def causal_part(weight: jax.Array | float, weights: Any = None) -> tuple[jax.Array, Any]:
            """The causal KL and its per-layer gradient, scaled by ``weight``, at the effective
            ``weights`` (None: the step's ``eff``)."""
            reference = jax.lax.stop_gradient(aux["log_probs"][:batch_size])
            at = eff if weights is None else weights
            loss, causal_vjp = jax.vjp(lambda e: intervened(e, reference), at)
            (grads,) = causal_vjp(weight)
            return loss, grads

        def causal_row(weight: jax.Array | float) -> tuple[jax.Array, Any]:
            """The causal KL and its flat gradient row [n_params] (with the Pallas tail, the
            row's per-leaf segments), pulled back on its own.
            Stacking the per-layer cotangents before one pull-back over 3 parts was a pass of
            its own per layer (42 us for the 64 x 64 kernel at 1,024 learners, Y9); the flat
            rows are pieces of the flat gradient's assembly, so stacking them costs no pass."""
            if not cond_causal:  # (the cond comes only with the Pallas tail's segments)
                loss, grads = causal_part(weight)
                (row,) = pull_back(grads)
                return loss, row
            # Under the cond the kernels write the parameters' segments in place; the
            # effective weights and their pull-back taken outside it would hold those very
            # buffers as cond operands, and XLA copies such an operand (the head kernel:
            # 40 MB at 1,024 learners). Taken again in the branch, they read the segments
            # before the kernels write them.
            again, again_back, _ = jax.vjp(effective, params, has_aux=True)
            loss, grads = causal_part(weight, again)
            (row,) = again_back(grads)
            return loss, row

        loss_causal = jnp.float32(0)
        if use_causal and not separate_causal:
            loss_causal, causal_grads = causal_part(loss_cfg.causal_weight * causal_on)
            if use_diversity:  # the third part: diversity plus causal
                eff_grads = jax.tree.map(lambda g, c: g.at[2].add(c), eff_grads, causal_grads)
            else:
                eff_grads = jax.tree.map(
                    lambda g, c: jnp.concatenate([g, c[None]]), eff_grads, causal_grads
                )
        # [P, n_params] float32; with the Pallas tail its per-leaf segments [P, n_k] instead.
        (flat,) = jax.vmap(pull_back)(eff_grads)
        if fused_tail:
            # XLA's layout assignment lets the first of the head's two backward GEMMs in the
            # loop body's post order set the layout of the cotangent they share; the operands
            # of this barrier, last segment first, put the input-gradient GEMM (rows outermost,
            # as dense_stack writes the cotangent) before the kernel-gradient GEMM. In flat
            # order the kernel-gradient GEMM came first and the 100 MB cotangent was written
            # twice (BENCHMARKS.md, E1-E8).
            flat = jax.lax.optimization_barrier(flat[::-1])[::-1]
        if separate_causal and not cond_causal:
            loss_causal, flat_causal = causal_row(loss_cfg.causal_weight * causal_on)
            flat = _with_part(flat, flat_causal)  # [3, n_params] or its segments

        def guard_losses(loss_causal: jax.Array) -> tuple[jax.Array, jax.Array]:
            """The loss parts [3] (the third: diversity plus the weighted causal term) and
            whether any of them or the causal KL is non-finite."""
            extra = main_parts[2] + loss_cfg.causal_weight * causal_on * loss_causal
            parts = jnp.stack([main_parts[0], main_parts[1], extra])
            return parts, ~_all_finite((parts, loss_causal))

        checks.finite("gradient", "grad_mse", _part(flat, 0))
        checks.finite("gradient", "grad_c51", _part(flat, 1))
        if jax.tree.leaves(flat)[0].shape[0] == 3:  # a diversity or causal part
            checks.finite("gradient", "grad_extra", _part(flat, 2))

        # 12. PER priorities |y - Q| of the sampled rows (head mean); donors never write.
        td = jnp.mean(jnp.abs(y - q_taken), axis=-1)[:batch_size]  # [B]
        checks.finite("per", "priorities", td)

        # 13 (first half). The guard's checks that do not depend on the update.
        with jax.named_scope("guard"):
            q_abs_max = jnp.max(jnp.abs(q))
            batch_bad = ~_all_finite((obs, next_obs, batch.reward, batch.price_change))
            q_bad = ~_all_finite((q, q_next, q_star))
            clip_bad = ~(q_abs_max <= loss_cfg.q_clip)
            priorities_bad = ~_all_finite(td)
            net_cfg = cfg.network
            q_edge_bad, edge_mass_bad = losses.support_collapse(
                q,
                projected,
                net_cfg.v_min,
                net_cfg.v_max,
                net_cfg.n_atoms,
                loss_cfg.edge_mass_limit,
            )

        # 7-8. Gradient vaccine every gv_every steps, then the down-only budget (split as the
        # loss blends: C51 gets no share while it is off); 10-11: Adam on the sum, masks,
        # target sync (Polyak when tau > 0, else a hard copy every target_every steps); 13:
        # kept only if the guard passes.
        surgery_args = (
            state.phi_hat,
            loss_cfg.gv_beta,
            schedule % loss_cfg.gv_every == 0,
            budget_shares(alpha, loss_cfg.budget_split, loss_cfg.budget_share_mse),
            loss_cfg.grad_budget,
        )
        next_step = state.step + 1
        sync = (schedule + 1) % cfg.optim.target_every == 0
        surgery: SurgeryScalars | SurgeryResult  # the metrics read the fields both have
        adam_state = state.opt_state[0]
        count = optax.safe_increment(adam_state.count)

        def fused_update(
            flat: Any, loss_bad: jax.Array
        ) -> tuple[SurgeryScalars, flat_tail.AdamSelect, jax.Array]:
            """Pallas kernels (pallas_kernels.flat_tail): the surgery's reductions over the
            ``flat [parts, n_params]`` gradient; then Adam, masks and sync, kept or rejected by
            the guard and written in place. Also whether every part's gradient is finite."""
            with jax.named_scope("surgery"):
                row_max, gram = flat_tail.gram(flat, impl=tail_impl)
                surgery = gradient_surgery_scalars(row_max, gram, *surgery_args)
            # max |g| is NaN exactly when a part's gradient is non-finite (flat_tail.gram).
            parts_finite = _all_finite(row_max)
            pre_ok = ~state.guard.halted & ~(
                batch_bad
                | loss_bad
                | q_bad
                | clip_bad
                | priorities_bad
                | q_edge_bad
                | edge_mass_bad
            )
            with jax.named_scope("adam"):
                tail = flat_tail.adam_select(
                    flat,
                    surgery.weights,
                    flat_tail.TailVectors(
                        state.params, masks, state.target_params, adam_state.mu, adam_state.nu
                    ),
                    flat_tail.TailScalars(
                        bias1=1 - ADAM_B1**count,
                        bias2=1 - ADAM_B2**count,
                        pre_ok=pre_ok & parts_finite,
                        sync=sync,
                    ),
                    adam_hyper,
                    impl=tail_impl,
                    bounds=state.tail_bounds,
                    row_max=row_max,
                )
            # The weights' length is the number of parts, which differs between the causal
            # cond's branches; only the two main parts' weights are kept.
            return surgery._replace(weights=surgery.weights[:2]), tail, parts_finite

        if cond_causal:  # with the Pallas tail only (separate_causal)

            def causal_due_step(_: None) -> tuple[jax.Array, Any]:
                loss, row = causal_row(loss_cfg.causal_weight)
                full = _with_part(flat, row)  # [3, n_params] or its segments
                return loss, fused_update(full, guard_losses(loss)[1])

            def causal_not_due_step(_: None) -> tuple[jax.Array, Any]:
                # Two parts: the kernels read no gradient row of zeros.
                loss = jnp.float32(0)
                return loss, fused_update(flat, guard_losses(loss)[1])

            loss_causal, (surgery, tail, parts_finite) = jax.lax.cond(
                causal_due, causal_due_step, causal_not_due_step, None
            )
        loss_parts, loss_bad = guard_losses(loss_causal)
        if fused_tail:
            if not cond_causal:
                surgery, tail, parts_finite = fused_update(flat, loss_bad)
            gradient_bad = ~(parts_finite & tail.total_finite)
            params_sq_norm = tail.params_sq_norm
        else:
            with jax.named_scope("surgery"):
                full = gradient_surgery(flat, *surgery_args)
            checks.finite("surgery", "grad_mse", full.g1)
            checks.finite("surgery", "grad_c51", full.g2)
            surgery = full
            # 10. On CPU the total is materialised before Adam, as the debug checks of it force:
            # fused into Adam's loop it rounds differently (contracted multiply-adds), and a
            # --debug run would no longer reproduce the plain run bit for bit. GPU programs are
            # left as they are (a debug run differs there anyway: README).
            grad_total = jax.lax.platform_dependent(
                full.total, cpu=jax.lax.optimization_barrier, default=lambda total: total
            )
            checks.finite("gradient", "grad_total", grad_total)
            with jax.named_scope("adam"):
                updates, opt_state = optimizer.update(grad_total, state.opt_state, params)
                checks.finite_norm("adam", "update", layout.unravel(updates))
                new_params = masked(optax.apply_updates(params, updates), masks)  # [n_params]
                checks.finite_norm("adam", "new_params", layout.unravel(new_params))
            with jax.named_scope("target_sync"):
                old_target = layout.flat(state.target_params)  # flat with XLA's tail
                if cfg.optim.tau > 0:
                    tau = cfg.optim.tau
                    target_params = (1.0 - tau) * old_target + tau * new_params
                else:
                    target_params = jnp.where(sync, new_params, old_target)
            # max |g| is NaN/inf exactly when a part's gradient is: no pass over flat.
            gradient_bad = ~(_all_finite(full.row_max) & _all_finite(grad_total))
            # Finite exactly when every new parameter is and the squared norm does not overflow.
            params_sq_norm = jnp.sum(jnp.square(new_params))

        # 13. Guard: the first failing quantity, in GUARD_REASONS order.
        failures = jnp.stack(
            [
                batch_bad,
                loss_bad,
                gradient_bad,
                ~jnp.isfinite(params_sq_norm),
                q_bad,
                clip_bad,
                priorities_bad,
                q_edge_bad,
                edge_mass_bad,
            ]
        )  # [len(GUARD_REASONS) - 1] bool
        failed = jnp.any(failures)
        apply_update = ~state.guard.halted & ~failed
        newly_halted = ~state.guard.halted & failed
        guard = GuardRecord(
            halted=state.guard.halted | failed,
            step=jnp.where(newly_halted, state.step, state.guard.step).astype(jnp.int32),
            reason=jnp.where(
                newly_halted, jnp.argmax(failures).astype(jnp.int32) + 1, state.guard.reason
            ).astype(jnp.int32),
        )
        # The guard's decision is a row mask here: a rejected step writes no priority, and the
        # write stays O(B) (no select over the [C] priorities).
        with jax.named_scope("per_update"):
            replay = replay_update(
                state.replay,
                indices,
                td,
                jnp.broadcast_to(apply_update, indices.shape),
                cfg.replay.priority_eps,
                cfg.replay.priority_max,
            )
        if fused_tail:
            # The kernel has already kept or rejected the vectors (its decision is apply_update:
            # the same checks); Adam's count follows it.
            kept_params, kept_target = tail.params, tail.target
            kept_opt_state = (
                adam_state._replace(
                    count=jnp.where(apply_update, count, adam_state.count),
                    mu=tail.mu,
                    nu=tail.nu,
                ),
                *state.opt_state[1:],
            )
        else:
            kept_params, kept_target = _select(
                apply_update, (new_params, target_params), (state.params, state.target_params)
            )
            kept_opt_state = _select(apply_update, opt_state, state.opt_state)
        # Only the priorities change in the buffer; the transitions are not selected (no copy).
        new_state = LearnerState(
            params=kept_params,
            target_params=kept_target,
            sn_u=_select(apply_update, new_u, state.sn_u),
            masks=state.masks if masks is None else jnp.where(apply_update, masks, state.masks),
            opt_state=kept_opt_state,
            phi_hat=jnp.where(apply_update, surgery.phi_hat, state.phi_hat),
            replay=replay,
            step=next_step,
            guard=guard,
            key=jnp.where(apply_update, key, state.key),
            bootstrap_key=state.bootstrap_key,
            tail_bounds=tail.bounds if fused_tail else flat_tail.unknown_bounds(),
        )

        # 14. Metrics.
        with jax.named_scope("metrics"):
            written = replay.priorities[indices]  # [B] as stored (sanitised, clipped)
            metrics = LearnerMetrics(
                loss_mse=loss_parts[0],
                loss_c51=loss_parts[1],
                loss_div=main_parts[2],
                # The causal KL only on the steps its term is due (with the cond it is not
                # computed on the others), so every tail reports the same.
                loss_causal=jnp.where(causal_due, loss_causal, 0.0),
                causal_applied=causal_on * float(use_causal),
                grad_norm_mse=surgery.norms[0],
                grad_norm_c51=surgery.norms[1],
                grad_norm_mse_after=surgery.norms_after[0],
                grad_norm_c51_after=surgery.norms_after[1],
                grad_norm_total=surgery.total_norm,
                vaccine_cos=surgery.phi,
                phi_hat=surgery.phi_hat,
                vaccine_applied=surgery.applied.astype(jnp.float32),
                # The barrier keeps q as computed: XLA merges mean(sum over atoms) into one
                # reduction over the [R, K, A, N] distributions, a pass over 50 MB at 1,024
                # learners (20 us on the H200, BENCHMARKS.md, C4) instead of over q's 1 MB.
                q_mean=jnp.mean(jax.lax.optimization_barrier(q)),
                q_max=q_abs_max,
                edge_mass=jnp.mean(losses.edge_mass(projected)),
                priority_mean=jnp.mean(written),
                priority_max=jnp.max(written),
                sigma_max=jnp.max(sigmas, initial=0.0),
                # Masks change only through pruning: without it they stay all ones.
                sparsity=(
                    networks.mask_sparsity(layout.unravel(masks))
                    if use_pruning and masks is not None
                    else 0.0
                ),
                alpha=alpha,
                halted=guard.halted.astype(jnp.float32),
            )
        metrics = jax.tree.map(lambda m: jnp.asarray(m, jnp.float32), metrics)
        return new_state, metrics

    return Learner(init=init, insert=insert, step=step, act_q=act_q, layout=layout)
