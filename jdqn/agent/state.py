"""The learner's named state, metrics and function bundle (docs/design.md, sections 2 and 5)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax

from jdqn.agent.losses import smoothing_weights
from jdqn.agent.networks import ParamLayout, Params
from jdqn.agent.nstep import gamma_powers
from jdqn.agent.replay import ReplayState
from jdqn.agent.transition import Transition
from jdqn.config import Config

# Why the guard stopped a fold; ``GuardRecord.reason`` indexes this tuple. Checked in this order.
GUARD_REASONS: tuple[str, ...] = (
    "none",
    "batch",  # a sampled transition holds a non-finite observation, reward or price change
    "loss",  # a loss part is non-finite
    "gradient",  # a gradient (before or after surgery) is non-finite
    "params",  # a new parameter is non-finite, or their squared norm overflows float32
    "q_nonfinite",  # an online or target Q value is non-finite
    "q_clip",  # max |Q| > loss.q_clip
    "priorities",  # a new PER priority is non-finite before sanitising
    "q_edge",  # a Q value within one atom of the support's edge (losses.support_collapse)
    "edge_mass",  # mean projected target mass on the edge atoms > loss.edge_mass_limit
)


class Hyper(NamedTuple):
    """The settings a learner carries as values, not compile-time constants, so that the learners
    of one program may differ in them (a sweep's settings axis, issue 46)."""

    learning_rate: jax.Array  # [] float32, optim.learning_rate
    discounts: jax.Array  # [n_step + 1] float32, loss.gamma's powers (nstep.gamma_powers)
    epsilon_end: jax.Array  # [] float32, train.epsilon_end
    # [train.epochs] float32, loss.alpha_schedule: the C51 blend weight of each epoch, padded
    # with its last value (so that schedules of any length share one shape)
    alpha_schedule: jax.Array
    label_smoothing: jax.Array  # [2] float32, (1 - eps, eps / N) (losses.smoothing_weights)
    hold_penalty: jax.Array  # [] float32, env.hold_penalty (the training reward's hold charge)
    act_risk: jax.Array  # [] float32, train.act_risk (acting's and the target's a*)
    # [] int32, optim.target_every: the hard target sync's period in learner steps (unread when
    # optim.tau > 0, a static choice of the program)
    target_every: jax.Array
    train_cost_scale: jax.Array  # [] float32, env.train_cost_scale (the training reward's cost)


# The config keys :class:`Hyper` carries, in its order: settings that differ only in these can
# train as learners of one program.
HYPER_KEYS = (
    "optim.learning_rate",
    "loss.gamma",
    "train.epsilon_end",
    "loss.alpha_schedule",
    "loss.label_smoothing",
    "env.hold_penalty",
    "train.act_risk",
    "optim.target_every",
    "env.train_cost_scale",
)


def hyper_of(cfg: Config) -> Hyper:
    """``cfg``'s values of :data:`HYPER_KEYS` (stack them for many learners)."""
    schedule = cfg.loss.alpha_schedule
    padded = [schedule[min(epoch, len(schedule) - 1)] for epoch in range(cfg.train.epochs)]
    return Hyper(
        learning_rate=jnp.float32(cfg.optim.learning_rate),
        discounts=jnp.asarray(gamma_powers(cfg.loss.gamma, cfg.loss.n_step)),
        epsilon_end=jnp.float32(cfg.train.epsilon_end),
        alpha_schedule=jnp.asarray(padded, jnp.float32),
        label_smoothing=jnp.asarray(
            smoothing_weights(cfg.loss.label_smoothing, cfg.network.n_atoms)
        ),
        hold_penalty=jnp.float32(cfg.env.hold_penalty),
        act_risk=jnp.float32(cfg.train.act_risk),
        target_every=jnp.int32(cfg.optim.target_every),
        train_cost_scale=jnp.float32(cfg.env.train_cost_scale),
    )


class GuardRecord(NamedTuple):
    """First failure seen by the guard; once halted, steps are no-ops."""

    halted: jax.Array  # [] bool
    step: jax.Array  # [] int32, learner step (0-based) that failed; -1 = never
    reason: jax.Array  # [] int32, index into GUARD_REASONS


@flax.struct.dataclass
class LearnerState:
    """Everything the learner carries between steps (docs/design.md, section 2); leaves gain a
    leading [S] axis under vmap over seeds/folds. Parameters, target, masks and Adam's moments
    are the network's parameter tree (float32) whatever steps the learner (``jdqn.accel``), so a
    checkpoint resumes under any implementation."""

    params: Params  # online net
    target_params: Params  # target net (torso and every head)
    sn_u: dict[str, jax.Array]  # {torso_l: [H_l] float32} spectral-norm vectors (stop-gradient)
    masks: Params  # {0, 1} float32 pruning masks (biases always 1)
    # jdqn.accel.adam_init's: optax.adam's moments mu, nu (trees like params) and count [] int32,
    # then the flat tail's bounds record ([] float32 each), which only its kernels read
    opt_state: optax.OptState
    phi_hat: jax.Array  # [] float32, gradient-vaccine EMA of cos(g_mse, g_c51)
    replay: ReplayState  # PER ring buffer, [C, ...] transitions and [C] priorities
    step: jax.Array  # [] int32, learner steps taken (guarded or not)
    guard: GuardRecord  # [] leaves
    key: jax.Array  # [2] uint32, advanced every applied step
    bootstrap_key: jax.Array  # [2] uint32, fixed: per-transition ensemble bootstrap masks
    hyper: Hyper  # the learner's settings that are values (fixed)


def guard_record(
    old: GuardRecord, failures: jax.Array, step: jax.Array
) -> tuple[GuardRecord, jax.Array]:
    """The guard after this step's ``failures [len(GUARD_REASONS) - 1]`` bool (in
    GUARD_REASONS order), and whether the step's update is applied (no failure, not halted)."""
    failed = jnp.any(failures)
    newly_halted = ~old.halted & failed
    record = GuardRecord(
        halted=old.halted | failed,
        step=jnp.where(newly_halted, step, old.step).astype(jnp.int32),
        reason=jnp.where(newly_halted, jnp.argmax(failures) + 1, old.reason).astype(jnp.int32),
    )
    return record, ~old.halted & ~failed


class LearnerMetrics(NamedTuple):
    """Per-step diagnostics, all [] float32 (docs/design.md, section 5, step 14)."""

    loss_mse: float | jax.Array  # IS-weighted mean scaled squared error (before alpha)
    loss_c51: float | jax.Array  # IS-weighted mean cross-entropy (before alpha)
    loss_div: float | jax.Array  # lambda_div * mean head cosine (0 when K == 1)
    loss_causal: float | jax.Array  # mean KL(p(s) || p(do(s))), unweighted; 0 when not due
    grad_norm_mse: float | jax.Array  # |g_mse| (alpha-weighted) before surgery
    grad_norm_c51: float | jax.Array  # |g_c51| (alpha-weighted) before surgery
    grad_norm_mse_after: float | jax.Array  # after vaccine and budget
    grad_norm_c51_after: float | jax.Array
    grad_norm_total: float | jax.Array  # norm of the summed gradient handed to Adam
    vaccine_cos: float | jax.Array  # phi = cos(g_mse, g_c51)
    phi_hat: float | jax.Array  # EMA after this step
    vaccine_applied: float | jax.Array  # 1 when the vaccine changed the gradients
    causal_applied: float | jax.Array  # 1 when the causal term was due (in the loss)
    q_mean: float | jax.Array  # mean online Q(s, a) over rows, heads, actions
    q_max: float | jax.Array  # max |Q(s, a)| over rows, heads, actions (what the guard checks)
    edge_mass: float | jax.Array  # mean projected target mass on the two edge atoms
    priority_mean: float | jax.Array  # new PER priorities of the sampled rows
    priority_max: float | jax.Array
    sigma_max: float | jax.Array  # largest spectral-norm sigma of the torso (0 when off)
    sparsity: float | jax.Array  # fraction of kernel weights pruned
    alpha: float | jax.Array  # C51 blend weight used
    halted: float | jax.Array  # 1 when the guard has halted this learner


# LearnerMetrics' shapes and dtypes, for callers that build or unpack a record without tracing.
_F32_SCALAR: Any = jax.ShapeDtypeStruct((), jnp.float32)
LEARNER_METRICS_RECORD = LearnerMetrics(*[_F32_SCALAR for _ in LearnerMetrics._fields])


def pack_metrics(record: Any) -> jax.Array:
    """A pytree of scalar metrics as one float32 vector ``[M]`` (leaf order): a ``lax.scan``
    writes it in one kernel, where M scalars are M one-element writes. Bools and ints below
    2^24 round-trip exactly, as :func:`unpack_metrics` relies on."""
    return jnp.stack([jnp.asarray(x, jnp.float32) for x in jax.tree.leaves(record)], axis=-1)


def unpack_metrics(packed: jax.Array, like: Any) -> Any:
    """Inverse of :func:`pack_metrics`: ``packed [..., M]`` -> the tree of ``like`` (arrays or
    ``jax.ShapeDtypeStruct``), each leaf ``[...]`` in its original dtype."""
    leaves, treedef = jax.tree.flatten(like)
    if packed.shape[-1] != len(leaves):
        raise ValueError(
            f"packed metrics have {packed.shape[-1]} columns, the record {len(leaves)}"
        )
    return jax.tree.unflatten(
        treedef, [packed[..., i].astype(x.dtype) for i, x in enumerate(leaves)]
    )


class Learner(NamedTuple):
    """The learner's pure functions (:func:`jdqn.agent.step.make_learner`)."""

    # (key[, hyper]) -> state, replay buffer empty; hyper: the config's (hyper_of) by default
    init: Callable[..., LearnerState]
    insert: Callable[[LearnerState, Transition], LearnerState]  # PER insert at max priority
    # (state, alpha, beta[, clock]) -> (state, metrics), jit with donate_argnums=0
    step: Callable[..., tuple[LearnerState, LearnerMetrics]]
    # obs [B, F+1] -> acting scores [B, A] (head-mean Q unless jdqn.agent.acting adds more)
    act_q: Callable[[LearnerState, jax.Array], jax.Array]
    layout: ParamLayout  # the parameter tree's leaves, shapes and flat order
