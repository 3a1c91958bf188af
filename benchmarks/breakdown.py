"""Where the learner step's time goes: variants compiled with one component off, differenced.

The learner step is one executable, so per-operation timers cannot see inside it. Instead each
variant is compiled with one component switched off through the config (spectral norm, HER
donors, causal intervention, the Pallas projection swapped for the XLA hat kernel) and timed
inside ``lax.scan``; the component's cost is ``full - variant``. Components that have no config
switch (gradient surgery, Adam, PER, forward, losses) are timed *isolated*: the same
functions at the same shapes, in their own ``lax.scan``. Isolated costs overstate the marginal
cost inside the fused step (no fusion with neighbours), so the table says which method each row
used; the remainder (backward pass, guard, metrics, glue) is ``full - sum(rows)``.

    python -m benchmarks.breakdown [--quick]
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import optax

from jdqn import accel
from jdqn.accel.xla_flags import configure
from jdqn.agent import losses, networks
from jdqn.agent.replay import replay_sample, replay_update
from jdqn.agent.surgery import gradient_surgery
from jdqn.bench import markdown_table
from jdqn.bench.fixture import (
    BETA,
    N_FEATURES,
    filled_learner,
    scan_steps_fn,
    time_repeated,
    time_scan_steps,
)
from jdqn.config import SMOKETEST, Config, apply_overrides
from pallas_kernels import c51_project

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
        smoothing = losses.smoothing_weights(cfg.loss.label_smoothing, net.n_atoms)
        target = losses.label_smooth(projected, jnp.asarray(smoothing))
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
        ("Adam (optax)", adam, (state.params, optimizer.init(state.params))),
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
    configure()  # jdqn's XLA flags, before JAX starts a backend
    main()
