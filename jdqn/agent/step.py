"""The learner step: one pure function, jit-compiled with donated state (docs/design.md,
section 5).

:func:`make_learner` returns a :class:`Learner` of pure functions over :class:`LearnerState`,
each ``jit``- and ``vmap``-able over a leading seed/fold axis. Periodic parts (vaccine, causal
term, pruning, target sync) are selects or ``lax.cond`` on the step counter; Python branches
exist only on the static config and on each piece's implementation, which ``jdqn.accel.choose``
describes once here (:class:`jdqn.accel.Pieces`) and the step passes down as an argument.

Under ``vmap`` the step counter is batched, so a ``lax.cond`` on it runs both branches.
``clock`` is the same counter unbatched, for learners that step in lock-step (every vmapping
caller in jdqn): the schedules follow it, and a cond on it stays a branch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jdqn import accel as accel_module
from jdqn.accel import Pieces, SurgeryInputs, TailState, Update, all_finite, select
from jdqn.agent import acting, losses, networks, surgery
from jdqn.agent import debug as debug_mode
from jdqn.agent.batch import Batch, sample_batch
from jdqn.agent.checks import check_batch, check_online, check_state, check_target
from jdqn.agent.donors import n_donors_for
from jdqn.agent.replay import replay_add, replay_init, replay_update
from jdqn.agent.state import (
    GUARD_REASONS,
    GuardRecord,
    Hyper,
    Learner,
    LearnerMetrics,
    LearnerState,
    guard_record,
    hyper_of,
)
from jdqn.agent.transition import Transition, example_transition
from jdqn.config import Config

# Named scopes of the step's parts (``jax.named_scope``), as they appear in the op metadata of
# the compiled program; ``benchmarks/kernels.py`` attributes each kernel to one of them.
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


class Setup(NamedTuple):
    """What the step is built with (static: Python values and functions)."""

    cfg: Config
    pieces: Pieces  # each speed piece's implementation (jdqn.accel.choose)
    update: Callable[..., Update]  # the update in pieces.tail's form (jdqn.accel.make_update)
    non_causal: tuple[int, ...]  # feature columns the causal intervention permutes
    n_donors: int  # HER donor rows per step
    debug: bool  # value checks at the component boundaries


def make_learner(
    cfg: Config,
    n_features: int,
    non_causal: tuple[int, ...],
    debug: bool = False,
    learners: int = 1,
) -> Learner:
    """The learner for ``n_features`` feature columns (observations add the position).
    ``non_causal``: the columns the causal intervention permutes. ``debug``: value checks
    (``jdqn.agent.debug``) at each component boundary; off, they are absent from the program.
    ``learners``: how many one program steps under ``vmap``; it only picks the update's
    implementation (:func:`jdqn.accel.choose`)."""
    non_causal = tuple(int(i) for i in non_causal)
    if any(not 0 <= i < n_features for i in non_causal) or len(set(non_causal)) != len(non_causal):
        raise ValueError(
            f"non_causal: {non_causal} must be distinct feature columns in [0, {n_features}); "
            "the position column is never intervened on"
        )
    net, loss_cfg = cfg.network, cfg.loss
    layout = networks.param_layout(cfg, n_features + 1)
    pieces = accel_module.choose(cfg, backend=jax.default_backend(), debug=debug, learners=learners)
    setup = Setup(
        cfg=cfg,
        pieces=pieces,
        update=accel_module.make_update(pieces, cfg, layout),
        non_causal=non_causal if loss_cfg.causal_weight > 0 else (),
        n_donors=n_donors_for(
            cfg.train.batch_size, loss_cfg.donor_fraction, loss_cfg.donor_mode, cfg.env.n_actions
        ),
        debug=debug,
    )

    def init(key: jax.Array, hyper: Hyper | None = None) -> LearnerState:
        net_key, state_key, bootstrap_key = jax.random.split(key, 3)
        network = networks.init_network(net_key, cfg, n_features + 1)
        return LearnerState(
            params=network.params,
            target_params=jax.tree.map(jnp.copy, network.params),
            sn_u=network.sn_u,
            masks=network.masks,
            opt_state=accel_module.adam_init(cfg, network.params),
            phi_hat=jnp.zeros((), jnp.float32),
            replay=replay_init(
                cfg.replay.capacity, example_transition(n_features, cfg.loss.n_step)
            ),
            step=jnp.zeros((), jnp.int32),
            guard=GuardRecord(
                halted=jnp.zeros((), bool),
                step=jnp.full((), -1, jnp.int32),
                reason=jnp.zeros((), jnp.int32),
            ),
            key=state_key,
            bootstrap_key=bootstrap_key,
            hyper=jax.tree.map(jnp.asarray, hyper_of(cfg) if hyper is None else hyper),
        )

    def insert(state: LearnerState, transitions: Transition) -> LearnerState:
        return state.replace(replay=replay_add(state.replay, transitions))  # type: ignore[attr-defined]  # flax.struct adds .replace

    def act_q(state: LearnerState, obs: jax.Array) -> jax.Array:
        masks = state.masks if net.target_sparsity > 0 else None
        eff, _, _ = networks.effective_params(state.params, masks, state.sn_u, net, False)
        logits = networks.apply(eff, obs, cfg, pieces)
        hyper = state.hyper
        return acting.action_scores(
            logits, obs[..., -1], cfg, hyper.act_risk, hyper.train_cost_scale
        )

    step = functools.partial(learner_step, setup)
    return Learner(init=init, insert=insert, step=step, act_q=act_q, layout=layout)


def learner_step(
    setup: Setup,
    state: LearnerState,
    alpha: jax.Array,
    beta: jax.Array,
    clock: jax.Array | None = None,
) -> tuple[LearnerState, LearnerMetrics]:
    """One learner step (docs/design.md, section 5). ``clock``: ``state.step`` unbatched, shared
    by learners stepped in lock-step, for the schedules to follow (None: ``state.step``)."""
    cfg, pieces = setup.cfg, setup.pieces
    net, loss_cfg, batch_size = cfg.network, cfg.loss, cfg.train.batch_size
    alpha = jnp.asarray(alpha, jnp.float32)
    schedule = state.step if clock is None else jnp.asarray(clock, jnp.int32)
    key, sample_key, donor_key, causal_key, donor_mask_key = jax.random.split(state.key, 5)
    checks = debug_mode.boundaries(setup.debug, state.step)  # no-ops when debug is off
    check_state(checks, state, schedule, clock is not None)

    # 1-2. PER sample and HER donors (IS weight 1, never write priorities).
    batch = _sampled(state, (sample_key, donor_key, donor_mask_key), beta, setup)
    check_batch(checks, batch)

    # 3. Effective weights: pruning masks (recomputed on schedule), then spectral norm; the VJP
    # of the online ones pulls the loss parts' gradients back to the parameters.
    masks = _scheduled_masks(state, schedule, net) if net.target_sparsity > 0 else None
    eff, pull_back, (new_u, sigmas) = jax.vjp(
        functools.partial(_effective, masks=masks, sn_u=state.sn_u, net=net),
        state.params,
        has_aux=True,
    )
    # The online and the target net's logits at s'.
    next_logits = _logits_next(setup, state, eff, masks, new_u, batch.next_obs, checks)

    # 4. Double-DQN target, projection, label smoothing (stop-gradient): the learner's values
    values = _target_values(state, batch)
    target = losses.td_target(*next_logits, batch.reward, batch.discount, cfg, pieces, *values)
    check_target(checks, target, net)

    # 5-6. The loss parts and each one's gradient (one forward, one VJP per part).
    def online_loss_parts(e: Any) -> tuple[jax.Array, losses.OnlinePass]:
        with jax.named_scope("online_forward"):
            logits = networks.apply(e, batch.obs, cfg, pieces)  # [R, K, A, N]
        with jax.named_scope("losses"):
            action, weights = batch.transitions.action, batch.weights
            return losses.loss_parts(logits, action, weights, target, cfg, pieces)

    loss_values, parts_vjp, online = jax.vjp(online_loss_parts, eff, has_aux=True)
    check_online(checks, loss_values, online, losses.part_names(cfg), net)
    # The C51 blend by part name; every other part's gradient enters with weight 1.
    blend = {"mse": 1.0 - alpha, "c51": alpha}
    weights = jnp.stack([blend.get(name, jnp.float32(1)) for name in losses.part_names(cfg)])
    (part_grads,) = jax.vmap(parts_vjp)(jnp.diag(weights))  # tree, leaves [parts, ...]

    # 12 (computed here, written once the guard decided). PER priorities |y - Q| (head mean)
    # of the sampled rows; donors never write.
    td = jnp.mean(jnp.abs(target.y - online.q_taken), axis=-1)[:batch_size]  # [B]
    checks.finite("per", "priorities", td)

    # With 9's branch (below) the main parts are pulled back before it (inside, each kernel
    # gradient became a transposed copy, the branch's operand); without it, with the causal part.
    causal_branch = bool(setup.non_causal) and pieces.fused_tail and clock is not None
    main_grads = jax.vmap(pull_back)(part_grads)[0] if causal_branch else None

    def pulled_back_and_updated(causal_scale: jax.Array | None) -> tuple[jax.Array, Any]:
        """9 (the causal part at ``causal_scale``; None: absent), the pull-back, 13's checks
        before the update and 7-8, 10-11 -> (causal KL, (failures before the update, Update))."""
        loss_causal, causal_grads = jnp.float32(0), None
        if causal_scale is not None:
            reference = jax.lax.stop_gradient(online.log_probs[:batch_size])
            loss_causal, causal_grads = _causal_part(
                eff, batch.obs[:batch_size], reference, causal_key, causal_scale, setup, checks
            )
        grads = _pulled_back(pull_back, part_grads, causal_grads, main_grads)  # [parts, ...]
        checks.finite("gradient", "grad_mse", jax.tree.map(lambda g: g[0], grads))
        checks.finite("gradient", "grad_c51", jax.tree.map(lambda g: g[1], grads))
        with jax.named_scope("guard"):
            all_losses = jnp.append(loss_values, loss_cfg.causal_weight * loss_causal)
            before_update = _failures_before_update(batch, all_losses, online, target, td, cfg)
        update = setup.update(
            grads,
            TailState(state.params, state.target_params, masks, state.opt_state),
            _surgery_inputs(state.phi_hat, schedule, alpha, loss_cfg),
            ~state.guard.halted & ~jnp.any(jnp.stack(list(before_update.values()))),
            (schedule + 1) % state.hyper.target_every == 0,  # the learner's period
            state.hyper.learning_rate,
            checks,
        )
        return loss_causal, (before_update, update)

    # 9. The causal term, due every causal_every steps: under a branch given the unbatched clock
    # where jdqn.accel says it pays, else every step, switched by a 0/1 weight.
    causal_due = schedule % loss_cfg.causal_every == 0
    weight = jnp.float32(loss_cfg.causal_weight)
    if causal_branch:
        outcome = jax.lax.cond(
            causal_due,
            lambda: pulled_back_and_updated(weight),
            lambda: pulled_back_and_updated(None),
        )
    else:
        outcome = pulled_back_and_updated(weight * causal_due if setup.non_causal else None)
    loss_causal, (before_update, update) = outcome

    # 13. Guard: the first failing quantity, in GUARD_REASONS order; then the state (12: the
    # PER priorities of the sampled rows), the update kept only where the guard passed.
    guard, applied = guard_record(state.guard, _failures(before_update, update), state.step)
    new_state = _kept_state(
        state, update, guard, applied, (batch.indices, td), new_u, masks, key, cfg.replay
    )

    # 14. Metrics.
    with jax.named_scope("metrics"):
        extras = {  # besides the loss parts, the surgery's scalars, Q and the targets
            "loss_causal": jnp.where(causal_due, loss_causal, 0.0),
            "causal_applied": causal_due.astype(jnp.float32) * float(bool(setup.non_causal)),
            "priorities": new_state.replay.priorities[batch.indices],  # [B] as stored
            "sigma_max": jnp.max(sigmas, initial=0.0),
            "sparsity": networks.mask_sparsity(masks) if masks is not None else 0.0,
        }
        metrics = _metrics(loss_values, update, online, target, extras, alpha, guard, setup)
    return new_state, metrics


def _target_values(state: LearnerState, batch: Batch) -> tuple[jax.Array, ...]:
    """``td_target``'s per-learner arguments: label smoothing's weights, acting's risk, the
    position held at s' (post-trade values) and the training cost's scale."""
    hyper = state.hyper
    return (hyper.label_smoothing, hyper.act_risk, batch.next_obs[:, -1], hyper.train_cost_scale)


def _sampled(state: LearnerState, keys: Any, beta: jax.Array, setup: Setup) -> Batch:
    """Steps 1-2 from the learner's buffer, with its bootstrap key, discounts, hold charge and
    cost multiplier."""
    hyper, cfg = state.hyper, setup.cfg
    return sample_batch(
        state.replay, keys, state.bootstrap_key, beta, hyper.discounts, cfg, setup.n_donors,
        hold_penalty=hyper.hold_penalty, cost_scale=hyper.train_cost_scale,
    )  # fmt: skip


def _kept_state(
    state: LearnerState,
    update: Update,
    guard: GuardRecord,
    applied: jax.Array,
    priorities: tuple[jax.Array, jax.Array],
    new_u: dict[str, jax.Array],
    masks: Any,
    key: jax.Array,
    replay_cfg: Any,
) -> LearnerState:
    """The state after the step: the update as ``jdqn.accel`` kept it, and the rest (new ``u``,
    masks, phi_hat, key, the sampled rows' ``priorities = (indices [B], |y - Q| [B])``) kept
    where the guard ``applied`` the step. The priorities are a row mask: an O(B) write."""
    indices, td = priorities
    with jax.named_scope("per_update"):
        replay = replay_update(
            state.replay,
            indices,
            td,
            jnp.broadcast_to(applied, indices.shape),
            replay_cfg.priority_eps,
            replay_cfg.priority_max,
        )
    return LearnerState(
        params=update.state.params,
        target_params=update.state.target_params,
        sn_u=select(applied, new_u, state.sn_u),
        masks=state.masks if masks is None else select(applied, masks, state.masks),
        opt_state=update.state.opt_state,
        phi_hat=jnp.where(applied, update.surgery.phi_hat, state.phi_hat),
        replay=replay,
        step=state.step + 1,
        guard=guard,
        key=jnp.where(applied, key, state.key),
        bootstrap_key=state.bootstrap_key,
        hyper=state.hyper,
    )


def _logits_next(
    setup: Setup,
    state: LearnerState,
    eff: Any,
    masks: Any,
    new_u: Any,
    next_obs: jax.Array,
    checks: Any,
) -> tuple[jax.Array, jax.Array]:
    """The online net's and the target net's logits at s' ``[R, K, A, N]`` (the online ones
    pick a* for the double-DQN target: no gradient), checked with the spectral norm's new
    ``u`` in the order debug mode names the first failure."""
    cfg = setup.cfg
    with jax.named_scope("target_net"):
        target_eff, _, _ = networks.effective_params(
            state.target_params, masks, state.sn_u, cfg.network, False
        )
        target_logits_next = networks.apply(target_eff, next_obs, cfg, setup.pieces)
    with jax.named_scope("online_forward"):
        logits_next = networks.apply(eff, next_obs, cfg, setup.pieces)
    checks.finite("target_network", "logits_next", target_logits_next)
    checks.finite("spectral_norm", "u", new_u)
    checks.finite("online_network", "logits_next", logits_next)
    return logits_next, target_logits_next


def _effective(
    params: Any, masks: Any, sn_u: dict[str, jax.Array], net: Any
) -> tuple[Any, tuple[dict[str, jax.Array], jax.Array]]:
    """The online net's effective weights (mask, then spectral norm with ``u`` updated), and the
    new ``u`` and sigmas as auxiliary outputs: differentiated, the mask inside gives pruned
    entries a zero gradient."""
    eff, new_u, sigmas = networks.effective_params(params, masks, sn_u, net, True)
    return eff, (new_u, sigmas)


def _surgery_inputs(
    phi_hat: jax.Array, schedule: jax.Array, alpha: jax.Array, loss_cfg: Any
) -> SurgeryInputs:
    """The vaccine when due; the budget's shares (``surgery.budget_shares``: as the loss blends
    by default, none for C51 while its blend weight is 0)."""
    return SurgeryInputs(
        phi_hat,
        loss_cfg.gv_beta,
        schedule % loss_cfg.gv_every == 0,
        surgery.budget_shares(alpha, loss_cfg.budget_split, loss_cfg.budget_share_mse),
        loss_cfg.grad_budget,
    )


def _failures_before_update(
    batch: Batch,
    loss_values: jax.Array,
    online: losses.OnlinePass,
    target: losses.TdTarget,
    td: jax.Array,
    cfg: Config,
) -> dict[str, jax.Array]:
    """The guard's checks that do not depend on the update, [] bool by reason (GUARD_REASONS
    without gradient and params)."""
    loss_cfg, net = cfg.loss, cfg.network
    rows = (batch.obs, batch.next_obs, batch.reward, batch.transitions.price_change)
    q_edge, edge_mass = losses.support_collapse(
        online.q, target.projected, net.v_min, net.v_max, net.n_atoms, loss_cfg.edge_mass_limit
    )
    return {
        "batch": ~all_finite(rows),
        "loss": ~all_finite(loss_values),
        "q_nonfinite": ~all_finite((online.q, target.q_next, target.q_star)),
        "q_clip": ~(jnp.max(jnp.abs(online.q)) <= loss_cfg.q_clip),
        "priorities": ~all_finite(td),
        "q_edge": q_edge,
        "edge_mass": edge_mass,
    }


def _failures(before_update: dict[str, jax.Array], update: Update) -> jax.Array:
    """Every guard check, ``[len(GUARD_REASONS) - 1]`` bool in GUARD_REASONS order, by name."""
    failed = before_update | {
        "gradient": ~update.gradient_finite,
        "params": ~jnp.isfinite(update.params_sq_norm),
    }
    return jnp.stack([failed[reason] for reason in GUARD_REASONS[1:]])


def _metrics(
    loss_values: jax.Array,
    update: Update,
    online: losses.OnlinePass,
    target: losses.TdTarget,
    extras: dict[str, Any],
    alpha: jax.Array,
    guard: GuardRecord,
    setup: Setup,
) -> LearnerMetrics:
    """Step 14: each loss part, the gradient norms before and after surgery, the cosine, Q, the
    projected mass on the edge atoms and the written priorities, all [] float32."""
    cfg, surgery, priorities = setup.cfg, update.surgery, extras["priorities"]
    parts = dict(zip(losses.part_names(cfg), loss_values, strict=True))
    metrics = LearnerMetrics(
        loss_mse=parts["mse"],
        loss_c51=parts["c51"],
        loss_div=parts.get("diversity", 0.0),
        loss_causal=extras["loss_causal"],
        causal_applied=extras["causal_applied"],
        grad_norm_mse=surgery.norms[0],
        grad_norm_c51=surgery.norms[1],
        grad_norm_mse_after=surgery.norms_after[0],
        grad_norm_c51_after=surgery.norms_after[1],
        grad_norm_total=surgery.total_norm,
        vaccine_cos=surgery.phi,
        phi_hat=surgery.phi_hat,
        vaccine_applied=surgery.applied,
        # Q as the loss pass wrote it: without the barrier XLA merges the mean into a pass of
        # its own over the [R, K, A, N] distributions (21.5 us at 1,024 learners on the H200).
        q_mean=jnp.mean(setup.pieces.barrier(online.q)),
        q_max=jnp.max(jnp.abs(online.q)),
        edge_mass=jnp.mean(losses.edge_mass(target.projected)),
        priority_mean=jnp.mean(priorities),
        priority_max=jnp.max(priorities),
        sigma_max=extras["sigma_max"],
        sparsity=extras["sparsity"],
        alpha=alpha,
        halted=guard.halted,
    )
    return jax.tree.map(lambda m: jnp.asarray(m, jnp.float32), metrics)


def _scheduled_masks(state: LearnerState, schedule: jax.Array, net: Any) -> Any:
    """The pruning masks of this step: magnitude masks at the cubic schedule's sparsity on the
    steps pruning is due (Zhu & Gupta, 2017), else the stored ones."""
    return jax.lax.cond(
        networks.prune_due(schedule, net),
        lambda: networks.magnitude_masks(state.params, networks.prune_sparsity(schedule, net)),
        lambda: state.masks,
    )


def _causal_part(
    eff: Any,
    obs: jax.Array,
    reference: jax.Array,
    key: jax.Array,
    scale: jax.Array,
    setup: Setup,
    checks: Any,
) -> tuple[jax.Array, Any]:
    """The causal term (invariance under interventions, Peters et al., JRSS-B 2016): the mean
    KL(p(s) || p(do(s))) over the sampled rows ``obs [B, F+1]`` with the non-causal columns
    permuted, against the stop-gradient ``reference`` log-probabilities of s, and its gradient
    at the effective weights times ``scale``."""

    def kl(e: Any) -> jax.Array:
        causal_obs = losses.causal_intervention(key, obs, setup.non_causal)
        with jax.named_scope("online_forward"):
            logits_do = networks.apply(e, causal_obs, setup.cfg, setup.pieces)  # [B, K, A, N]
        checks.finite("online_network", "logits_intervened", logits_do)
        with jax.named_scope("losses"):
            loss = jnp.mean(losses.causal_kl(reference, logits_do, setup.pieces))
        checks.finite("loss", "loss_causal", loss)
        return loss

    loss, kl_vjp = jax.vjp(kl, eff)
    return loss, kl_vjp(jnp.asarray(scale, jnp.float32))[0]


def _pulled_back(
    pull_back: Any, part_grads: Any, causal_grads: Any | None, main_grads: Any | None
) -> Any:
    """Every part's gradient pulled back to the parameters (leaves [parts, ...]), the causal
    term's (None: absent) joining the main ``part_grads``. ``main_grads``: those main parts
    already pulled back; the causal part is then pulled back on its own."""
    if main_grads is None:
        parts = part_grads if causal_grads is None else _with_causal_part(part_grads, causal_grads)
        return jax.vmap(pull_back)(parts)[0]
    if causal_grads is None:
        return main_grads
    return _with_causal_part(main_grads, pull_back(causal_grads)[0])


def _with_causal_part(part_grads: Any, causal_grads: Any) -> Any:
    """The parts' gradients (leaves [parts, ...]) with the causal term's: added to the third
    part when there is one (every part after the first two enters the total with weight 1, so
    the sum is the same and the update reads one row fewer), else as a third part."""
    if jax.tree.leaves(part_grads)[0].shape[0] > 2:
        return jax.tree.map(lambda g, c: g.at[2].add(c), part_grads, causal_grads)
    return jax.tree.map(lambda g, c: jnp.concatenate([g, c[None]]), part_grads, causal_grads)
