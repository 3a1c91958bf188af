"""Where the learner step's time goes: variants compiled with one component off, differenced.

The learner step is one executable, so per-operation timers cannot see inside it. Instead each
variant is compiled with one component switched off through the config (spectral norm, HER
donors, causal intervention, the Pallas projection swapped for the XLA hat kernel) and timed
inside ``lax.scan``; the component's cost is ``full - variant``. Components that have no config
switch (gradient surgery, Adam, PER, forward, losses) are timed *isolated*: the same
functions at the same shapes, in their own ``lax.scan``. Isolated costs overstate the marginal
cost inside the fused step (no fusion with neighbours), so the table says which method each row
used; the remainder (backward pass, guard, metrics, glue) is ``full - sum(rows)``.

Also holds the shared fixture of the step benchmarks: :func:`filled_learner` (the smoketest
learner with a full buffer of random transitions) and :func:`time_scan_steps`.

    python -m jdqn.bench.breakdown [--quick]
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import optax

from jdqn import accel
from jdqn.agent import Learner, LearnerState, losses, make_learner, networks, pack_metrics
from jdqn.agent.replay import replay_sample, replay_update
from jdqn.agent.surgery import gradient_surgery
from jdqn.agent.transition import NStepReturn, Transition
from jdqn.bench import markdown_table
from jdqn.config import SMOKETEST, Config, apply_overrides
from pallas_kernels import c51_project

# Synthetic ES features of the smoketest run: 4 returns + 4 range + 1 volume + 6 calendar
# columns (jdqn.data.features); the calendar group (columns 9..14) is the non-causal one.
N_FEATURES = 15
NON_CAUSAL = tuple(range(9, 15))
ALPHA, BETA = 0.2, 0.7  # epoch-2 blend: every component (C51 included) on


def random_transitions(key: jax.Array, n: int, n_features: int, cfg: Config) -> Transition:
    """``n`` plausible transitions: normal features, positions/actions on the grid, rewards
    from price changes with costs (so donors recompute consistent rewards), 2% terminal; at
    ``loss.n_step`` > 1 with n-step returns of 1..n steps."""
    keys = jax.random.split(key, 6)
    positions = jnp.asarray(cfg.env.positions, jnp.float32)
    held = jax.random.randint(keys[0], (n,), 0, len(cfg.env.positions))
    action = jax.random.randint(keys[1], (n,), 0, len(cfg.env.positions)).astype(jnp.int32)
    price_change = 0.25 * jnp.round(4.0 * jax.random.normal(keys[2], (n,)))  # ticks of 0.25
    reward = positions[action] * price_change - cfg.env.cost_points * jnp.abs(
        positions[action] - positions[held]
    )
    done = (jax.random.uniform(keys[5], (n,)) < 0.02).astype(jnp.float32)
    n_step = None
    if cfg.loss.n_step > 1:  # the rows' n-step returns: m steps of rewards like the first one
        n_keys = jax.random.split(keys[5], 3)
        steps = jax.random.randint(n_keys[0], (n,), 1, cfg.loss.n_step + 1).astype(jnp.int32)
        n_step = NStepReturn(
            reward=(cfg.env.reward_scale * reward * steps).astype(jnp.float32),
            next_features=jax.random.normal(n_keys[1], (n, n_features), jnp.float32),
            next_position=positions[jax.random.randint(n_keys[2], (n,), 0, len(cfg.env.positions))],
            done=done,
            steps=steps,
        )
    return Transition(
        features=jax.random.normal(keys[3], (n, n_features), jnp.float32),
        position=positions[held],
        action=action,
        reward=(cfg.env.reward_scale * reward).astype(jnp.float32),
        next_features=jax.random.normal(keys[4], (n, n_features), jnp.float32),
        price_change=price_change.astype(jnp.float32),
        done=done,
        n_step=n_step,
    )


def filled_learner(
    cfg: Config = SMOKETEST, seed: int = 0, n_features: int = N_FEATURES
) -> tuple[Learner, LearnerState]:
    """The learner of ``cfg`` and a state whose buffer is full of random transitions."""
    learner = make_learner(cfg, n_features, NON_CAUSAL if n_features == N_FEATURES else ())
    return learner, filled_state(learner, jax.random.PRNGKey(seed), cfg, n_features)


def filled_state(
    learner: Learner, key: jax.Array, cfg: Config, n_features: int = N_FEATURES
) -> LearnerState:
    """A fresh state of ``learner`` whose buffer is full of random transitions (``key``: the
    init's and the transitions')."""
    key, data_key = jax.random.split(key)
    state = learner.init(key)
    capacity = cfg.replay.capacity
    return jax.jit(learner.insert)(state, random_transitions(data_key, capacity, n_features, cfg))


def scan_steps_fn(
    learner: Learner, n_steps: int, vmapped: bool = False, unroll: int = 1
) -> jax.stages.Wrapped:
    """jit(state -> n_steps learner steps in one lax.scan), state donated; metrics kept.
    ``unroll`` steps per loop iteration (``lax.scan``'s ``unroll``): one CUDA graph then holds
    that many steps, so the graph launches between steps are fewer."""
    return jax.jit(scan_steps(learner, n_steps, vmapped, unroll), donate_argnums=0)


def scan_steps(
    learner: Learner, n_steps: int, vmapped: bool = False, unroll: int = 1
) -> Callable[[LearnerState], tuple[LearnerState, Any]]:
    """state -> (state after ``n_steps`` learner steps in one lax.scan, packed metrics [n, M]);
    ``vmapped``: over a leading learner axis, in lock-step."""
    step = jax.vmap(learner.step, in_axes=(0, None, None, None)) if vmapped else learner.step

    def run(state: LearnerState) -> tuple[LearnerState, Any]:
        def body(carry: LearnerState, _: None) -> tuple[LearnerState, Any]:
            # The vmapped learners start together and step in lock-step: their step counter,
            # unbatched, is the learner's clock (as jdqn.agent.train gives it).
            clock = carry.step[0] if vmapped else None
            carry, metrics = step(carry, jnp.float32(ALPHA), jnp.float32(BETA), clock)
            # Metrics packed into one vector per step, as jdqn.agent.train records them.
            return carry, pack_metrics(metrics)

        return jax.lax.scan(body, state, None, length=n_steps, unroll=unroll)

    return run


def time_repeated(
    fn: Callable[[Any], Any], carry: Any, repeats: int, unpack: bool = True, warmup: int = 0
) -> tuple[dict[str, float], Any]:
    """Compile (first call), ``warmup`` untimed calls, then time ``repeats`` chained calls, each
    blocked on. Seconds: compile, median, min."""
    start = time.perf_counter()
    out = fn(carry)
    jax.block_until_ready(out)
    compile_s = time.perf_counter() - start
    carry = out[0] if unpack else out
    for _ in range(warmup):
        out = fn(carry)
        carry = out[0] if unpack else out
    jax.block_until_ready(out)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(carry)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - start)
        carry = out[0] if unpack else out
    return {
        "compile_s": compile_s,
        "median_s": statistics.median(times),
        "min_s": min(times),
    }, carry


def time_scan_steps(
    learner: Learner, state: LearnerState, n_steps: int, repeats: int
) -> dict[str, float]:
    """Learner steps inside one lax.scan: microseconds per step (median and min over repeats)."""
    timing, _ = time_repeated(scan_steps_fn(learner, n_steps), state, repeats)
    return {
        "us_per_step": 1e6 * timing["median_s"] / n_steps,
        "us_per_step_min": 1e6 * timing["min_s"] / n_steps,
        "compile_s": timing["compile_s"],
        "n_steps": n_steps,
        "repeats": repeats,
    }


# Config-switched components: (name, what is switched off, overrides).
ABLATIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("spectral norm", "network.spectral_norm=false", ("network.spectral_norm=false",)),
    ("HER donors", "loss.donor_mode=none (80 -> 64 rows)", ("loss.donor_mode=none",)),
    ("causal", "loss.causal_weight=0 (no do(s) rows, no KL)", ("loss.causal_weight=0",)),
    ("GPU kernels (Pallas vs XLA)", "accel.kernels=off", ("accel.kernels=off",)),
)


def _isolated(n_steps: int, repeats: int, cfg: Config) -> list[dict[str, Any]]:
    """Components without a switch, timed alone at the smoketest step's shapes, in a scan."""
    learner, state = filled_learner(cfg)
    net = cfg.network
    batch = cfg.train.batch_size
    rows = batch + int(round(cfg.loss.donor_fraction * batch))  # sampled + donors
    tree = jax.tree.map(jnp.multiply, state.params, state.masks)
    eff, _, _ = networks.effective_params(tree, None, state.sn_u, net, False)
    n_params = learner.layout.size
    key = jax.random.PRNGKey(3)
    obs = jax.random.normal(key, (2 * rows + batch, N_FEATURES + 1), jnp.float32)
    support = networks.atoms(net)
    pieces = accel.choose(cfg, backend=jax.default_backend(), debug=False, learners=1)
    optimizer = optax.adam(cfg.optim.learning_rate, eps=cfg.optim.adam_eps)

    def scan_of(body: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def run(carry: Any) -> Any:
            return jax.lax.scan(lambda c, _: (body(c), None), carry, None, length=n_steps)[0]

        return jax.jit(run)

    def forward(x: jax.Array) -> jax.Array:
        # Spectral norm, the online passes as the step runs them (s, do(s) and s', one chain
        # each) and the target pass on s'.
        eff_online, _, _ = networks.effective_params(tree, None, state.sn_u, net, True)
        next_obs = x[rows : 2 * rows]
        logits = networks.apply(eff_online, x[:rows], cfg, pieces)
        logits_do = networks.apply(eff_online, x[2 * rows :], cfg, pieces)
        logits_next = networks.apply(eff_online, next_obs, cfg, pieces)
        target = networks.apply(eff, next_obs, cfg, pieces)
        means = jnp.mean(logits) + jnp.mean(logits_do) + jnp.mean(logits_next)
        return x + 1e-9 * (means + jnp.mean(target))

    logits0 = networks.apply(eff, obs[: 2 * rows], cfg)[:, 0]  # [2R, A, N]
    action = jax.random.randint(key, (rows,), 0, cfg.env.n_actions)
    reward = jax.random.normal(key, (rows,))

    def loss_parts(logits: jax.Array) -> jax.Array:
        # Log-softmax, Q, double-DQN pick, projection, smoothing, MSE and C51 cross-entropy, KL.
        q_next = networks.q_values(logits[rows:], support)
        _, probs_star, q_star = losses.double_dqn_target(q_next, logits[rows:], support)
        discount = jnp.full((rows,), cfg.loss.gamma, jnp.float32)
        projected = c51_project(
            probs_star, reward, discount, net.v_min, net.v_max, pieces.projection
        )
        target = losses.label_smooth(projected, cfg.loss.label_smoothing)
        y = losses.scalar_target(reward, discount, q_star, net.v_min, net.v_max)
        q, cross_entropy = losses.c51_head(logits[:rows], support, action, target, pieces)
        q_taken = losses.select_action(q, action)
        total = jnp.mean(losses.q_regression_loss(q_taken, y, net.v_max - net.v_min, None))
        total += jnp.mean(cross_entropy)
        # As in the step: the causal reference is the sampled rows of the log-softmax that
        # c51_head computes too (XLA computes it once).
        reference = jax.nn.log_softmax(logits[:rows], axis=-1)[:batch]
        total += jnp.mean(losses.causal_kl(reference, logits[rows : rows + batch], pieces))
        return logits + 1e-9 * total

    def surgery(carry: tuple[jax.Array, jax.Array]) -> Any:
        # Vaccine (due every step here) and both budgets, as the step runs them: one fused pass.
        grads, phi_hat = carry
        result = gradient_surgery(
            grads, phi_hat, cfg.loss.gv_beta, jnp.bool_(True), (0.3, 0.7), cfg.loss.grad_budget
        )
        return jnp.stack([result.g1, result.g2]), result.phi_hat

    grads = 1e-3 * jax.random.normal(key, (n_params,))

    def adam(carry: Any) -> Any:
        params, opt_state = carry
        updates, opt_state = optimizer.update(learner.layout.unravel(grads), opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def per(carry: Any) -> Any:
        replay, k = carry
        k, sample_key = jax.random.split(k)
        indices, drawn, _ = replay_sample(replay, sample_key, batch, cfg.replay.alpha, BETA)
        replay = replay_update(
            replay,
            indices,
            jnp.abs(drawn.reward) + 0.1,
            None,
            cfg.replay.priority_eps,
            cfg.replay.priority_max,
        )
        return replay, k

    g1 = jax.random.normal(key, (n_params,))
    g2 = 0.5 * g1 + jax.random.normal(jax.random.PRNGKey(4), (n_params,))
    cases = (
        ("forward (SN + online s,s',do(s) + target s')", forward, obs),
        ("losses (softmax, DDQN, projection, MSE, C51, KL)", loss_parts, logits0),
        (
            "gradient surgery (vaccine + budget x2)",
            surgery,
            (jnp.stack([g1, g2]), jnp.float32(0.5)),
        ),
        ("Adam (optax)", adam, (state.params, state.opt_state)),
        ("PER sample + update", per, (state.replay, key)),
    )
    out = []
    for name, body, carry in cases:
        timing, _ = time_repeated(scan_of(body), carry, repeats, unpack=False)
        out.append(
            {
                "component": name,
                "method": "isolated",
                "switch": "-",
                "us_per_step": 1e6 * timing["median_s"] / n_steps,
            }
        )
    return out


def run(quick: bool = False, cfg: Config = SMOKETEST) -> list[dict[str, Any]]:
    """Rows: the full step, one row per component (ablation or isolated), and the remainder."""
    n_steps, repeats = (50, 3) if quick else (1_000, 5)
    learner, state = filled_learner(cfg)
    full = time_scan_steps(learner, state, n_steps, repeats)["us_per_step"]
    rows: list[dict[str, Any]] = [
        {"component": "full step", "method": "in-scan", "switch": "-", "us_per_step": full}
    ]
    for name, switch, overrides in ABLATIONS:
        variant_cfg = apply_overrides(cfg, list(overrides))
        learner, state = filled_learner(variant_cfg)
        variant = time_scan_steps(learner, state, n_steps, repeats)["us_per_step"]
        rows.append(
            {
                "component": name,
                "method": "ablation",
                "switch": switch,
                "us_per_step": full - variant,
                "variant_us_per_step": variant,
            }
        )
    rows += _isolated(n_steps, repeats, cfg)
    # The kernels' saving against XLA is not a part of the step (the isolated "losses" row holds
    # the projection).
    accounted = sum(r["us_per_step"] for r in rows[1:] if not r["component"].startswith("GPU"))
    rows.append(
        {
            "component": "remainder (backward, guard, metrics, glue)",
            "method": "full - rows",
            "switch": "-",
            "us_per_step": full - accounted,
        }
    )
    for row in rows:
        row["share"] = row["us_per_step"] / full
    return rows


# Top-level HLO instructions that launch no kernel of their own.
_NO_KERNEL = {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "while",
    "conditional",
    "call",
    "after-all",
    "opt-barrier",
    "partition-id",
    "replica-id",
}


def kernel_census(cfg: Config = SMOKETEST) -> dict[str, int]:
    """Count the kernel-launching instructions of the optimised HLO of the in-scan step.

    Top-level instructions of the scan's while body (one learner step): fusions, library calls
    (cuBLAS, Pallas/Triton custom calls) and unfused ops; fusion bodies and reducers are not
    counted (one fusion is one kernel). ``total`` approximates kernel launches per step (nested
    conditionals' branches, if any, are not counted)."""
    learner, state = filled_learner(cfg)
    text = cast(str, scan_steps_fn(learner, 8).lower(state).compile().as_text())
    bodies = set(re.findall(r"body=(%[\w.\-]+)", text))  # the scan's while body
    counts: dict[str, int] = {}
    skip = True
    for line in text.splitlines():
        header = re.match(r"^(?:ENTRY )?(%[\w.\-]+) .*\{$", line)
        if header:
            skip = header.group(1) not in bodies
            continue
        match = re.search(r"= [^=]*? ([a-z][\w\-]*)\(", line)
        if skip or not match or match.group(1) in _NO_KERNEL:
            continue
        counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    counts["total"] = sum(counts.values())
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    return markdown_table(
        ("component", "method", "switched off", "us/step", "share of full"),
        (
            (
                r["component"],
                r["method"],
                r["switch"],
                f"{r['us_per_step']:.1f}",
                f"{r['share']:.0%}",
            )
            for r in rows
        ),
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    print(format_table(run(args.quick)))


if __name__ == "__main__":
    main()
