"""The peer: jdqn's learner step re-implemented in PyTorch, timed eager and CUDA-graph captured.

What a researcher would otherwise write, doing the same work as ``jdqn.agent`` at the same
sizes, so the ratio is honest. Included, per step: proportional stratified PER sampling with IS
weights (one-level prefix sums: exact at the smoketest capacity), HER "best" donors with
recomputed rewards, spectral norm (one power iteration per torso layer, persistent ``u``, also on
the target net with the stored ``u``), the online pass over s, s' and do(s) in one matmul chain,
the target pass, double-DQN pick, hat-kernel C51 projection, label smoothing, clipped scalar
target, IS-weighted MSE and C51 cross-entropy, the causal KL (switched by a 0/1 factor every
``causal_every`` steps), three separate gradients (one backward per part), gradient vaccine
(computed every step, applied every ``gv_every`` steps by a select, as in jdqn), down-only budget,
Adam (``torch.optim.Adam``, fused on CUDA), masks re-applied, hard target sync (a select),
priority update (clear + scatter-max), and a guard that keeps the previous parameters and Adam
moments when anything is non-finite. No host synchronisation inside a step, so the same code is
CUDA-graph capturable. Not included: metrics beyond the loss parts and gradient norms, ensemble
heads (K = 1 only), pruning schedule (masks stay all ones at the smoketest profile), bootstrap
masks, the guard's support checks (``q_edge``, ``edge_mass``: a few reductions), n-step returns.

torch is not a jdqn dependency: this module imports it lazily and :func:`available` says whether
it can run. ``python -m benchmarks.torch_peer [--quick] [--json F]`` times jdqn's step (the
``jdqn bench`` configuration, per call and in ``lax.scan``) and the peer in one process and
prints the ratios.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from jdqn.config import Config


def available() -> bool:
    """Whether torch is importable here."""
    return importlib.util.find_spec("torch") is not None


@dataclass
class PeerBatch:
    """One learner batch as torch tensors (R = B sampled rows + D donors)."""

    obs: Any  # [R, F+1] float32
    next_obs: Any  # [R, F+1] float32
    obs_do: Any  # [B, F+1] float32, do(s): non-causal columns from a permuted batch
    action: Any  # [R] int64
    reward: Any  # [R] float32
    discount: Any  # [R] float32, gamma * (1 - done)
    row_weights: Any  # [R] float32, IS weights of sampled rows, 1 for donors
    indices: Any  # [B] int64, sampled buffer slots


class TorchPeer:
    """Learner state as torch tensors and a ``step()`` doing jdqn's step (module docstring).

    ``params``/``target_params``: {layer: {"kernel": [in, out], "bias": [out]}} numpy float32 in
    jdqn's (flax) layout; ``sn_u``: {torso_l: [H_l]}; ``replay``: dict of numpy arrays
    (Transition fields, ``priorities``, ``max_priority``).
    """

    def __init__(
        self,
        cfg: Config,
        non_causal: tuple[int, ...],
        params: dict[str, dict[str, np.ndarray]],
        target_params: dict[str, dict[str, np.ndarray]],
        sn_u: dict[str, np.ndarray],
        replay: dict[str, np.ndarray],
        device: str = "cpu",
        seed: int = 0,
    ) -> None:
        # Settings the peer does not implement are refused before torch is needed.
        if cfg.network.n_heads != 1:
            raise ValueError("TorchPeer: network.n_heads must be 1 (the peer has no ensemble)")
        if cfg.loss.n_step != 1:
            raise ValueError("TorchPeer: loss.n_step must be 1 (the peer has one-step targets)")
        import torch

        self.torch = torch
        self.cfg = cfg
        self.device = torch.device(device)
        t = lambda x, dtype=torch.float32: torch.as_tensor(np.array(x), dtype=dtype).to(self.device)
        net = cfg.network
        self.layers = [f"torso_{i}" for i in range(len(net.hidden))] + ["head"]
        self.params = {n: {k: t(v).requires_grad_() for k, v in params[n].items()} for n in params}
        self.target = {n: {k: t(v) for k, v in target_params[n].items()} for n in target_params}
        self.masks = {n: {k: torch.ones_like(v) for k, v in self.target[n].items()} for n in params}
        self.sn_u = {n: t(u) for n, u in sn_u.items()}
        self.flat_params = [self.params[n][k] for n in self.layers for k in ("kernel", "bias")]
        self.support = t(np.float32(net.v_min) + np.arange(net.n_atoms) * np.float32(net.delta_z))
        self.positions = t(cfg.env.positions)
        self.non_causal = torch.as_tensor(non_causal, dtype=torch.int64, device=self.device)
        self.replay = {
            k: t(v, torch.int64 if k == "action" else torch.float32) for k, v in replay.items()
        }
        self.phi_hat = t(np.float32(0.0))
        self.step_count = torch.zeros((), dtype=torch.int64, device=self.device)
        self.alpha = t(np.float32(0.2))
        self.beta = t(np.float32(0.7))
        on_cuda = self.device.type == "cuda"
        self.optimizer = torch.optim.Adam(
            self.flat_params,
            lr=cfg.optim.learning_rate,
            eps=cfg.optim.adam_eps,
            fused=on_cuda or None,
            capturable=on_cuda,
        )
        torch.manual_seed(seed)
        self.batch_size = cfg.train.batch_size
        frac = cfg.loss.donor_fraction if cfg.loss.donor_mode == "best" else 0.0
        if cfg.loss.donor_mode == "all":
            raise ValueError("TorchPeer: loss.donor_mode 'all' is not implemented in the peer")
        if cfg.loss.mse_unit != "support":
            raise ValueError("TorchPeer: loss.mse_unit must be 'support' (the peer's MSE)")
        self.n_donors = min(int(round(frac * self.batch_size)), self.batch_size)

    # ------------------------------------------------------------------ network
    def _sn(self, kernel: Any, u: Any) -> tuple[Any, Any, Any]:
        """One power iteration; W / max(sigma, 1) (or / sigma) (Miyato et al., 2018)."""
        torch = self.torch
        w = kernel.detach()
        v = w @ u
        v = v / (torch.linalg.vector_norm(v) + 1e-12)
        u_next = v @ w
        u_next = u_next / (torch.linalg.vector_norm(u_next) + 1e-12)
        sigma = v @ kernel @ u_next
        clip = self.cfg.network.spectral_mode == "clip"
        scale = torch.clamp(sigma, min=1.0) if clip else sigma
        return kernel / scale, u_next, sigma

    def _effective(self, params: dict[str, dict[str, Any]]) -> tuple[dict, dict]:
        eff, new_u = {}, {}
        for name in self.layers:
            kernel = params[name]["kernel"] * self.masks[name]["kernel"]
            bias = params[name]["bias"] * self.masks[name]["bias"]
            if name != "head" and self.cfg.network.spectral_norm:
                kernel, new_u[name], _ = self._sn(kernel, self.sn_u[name])
            eff[name] = (kernel, bias)
        return eff, new_u

    def _apply(self, eff: dict[str, tuple[Any, Any]], x: Any) -> Any:
        for name in self.layers[:-1]:
            kernel, bias = eff[name]
            x = self.torch.relu(x @ kernel + bias)
        kernel, bias = eff["head"]  # [out, in], as jdqn stores it (jdqn.agent.networks.HEAD)
        out = x @ kernel.T + bias
        return out.reshape(x.shape[0], self.cfg.env.n_actions, self.cfg.network.n_atoms)

    # ------------------------------------------------------------------ batch
    def sample(self) -> PeerBatch:
        """PER sample (stratified proportional) and best-action donors, on device."""
        torch, cfg, rp = self.torch, self.cfg, self.replay
        batch = self.batch_size
        p = rp["priorities"]
        written = p > 0
        safe_p = torch.where(written, p, torch.ones_like(p))
        mass = torch.where(written, safe_p**cfg.replay.alpha, torch.zeros_like(p))
        cumulative = torch.cumsum(mass, 0)
        total = cumulative[-1]
        strata = torch.arange(batch, device=self.device, dtype=torch.float32)
        position = (strata + torch.rand(batch, device=self.device)) * (total / batch)
        position = torch.minimum(position, torch.nextafter(total, torch.zeros_like(total)))
        indices = torch.searchsorted(cumulative, position, right=True).clamp_(max=p.shape[0] - 1)
        log_p = torch.log(safe_p)[indices]
        weights = torch.exp(-(cfg.replay.alpha * self.beta) * (log_p - log_p.min()))
        return self.batch_from(indices, weights, self._donor_rows(), self._permutation())

    def _donor_rows(self) -> Any:
        return torch_argsort_rand(self.torch, self.batch_size, self.device)[: self.n_donors]

    def _permutation(self) -> Any:
        return torch_argsort_rand(self.torch, self.batch_size, self.device)

    def batch_from(
        self, indices: Any, weights: Any, donor_rows: Any, permutation: Any
    ) -> PeerBatch:
        """Rows ``indices`` [B] of the buffer plus hindsight-best donors of rows ``donor_rows``
        (of the sampled batch), and do(s) from ``permutation`` [B] of the sampled rows."""
        torch, cfg, rp = self.torch, self.cfg, self.replay
        features = rp["features"][indices]
        position = rp["position"][indices]
        action = rp["action"][indices]
        reward = rp["reward"][indices]
        next_features = rp["next_features"][indices]
        price_change = rp["price_change"][indices]
        done = rp["done"][indices]
        if self.n_donors > 0:
            held = position[donor_rows][:, None]
            all_rewards = cfg.env.reward_scale * (
                self.positions[None, :] * price_change[donor_rows][:, None]
                - cfg.env.cost_points * torch.abs(self.positions[None, :] - held)
            )  # [D, A]
            taken = action[donor_rows]
            others = torch.arange(cfg.env.n_actions, device=self.device)[None, :] != taken[:, None]
            masked = torch.where(others, all_rewards, torch.full_like(all_rewards, -torch.inf))
            donor_action = torch.argmax(masked, dim=1)
            donor_reward = torch.gather(all_rewards, 1, donor_action[:, None])[:, 0]
            features = torch.cat([features, features[donor_rows]])
            next_features = torch.cat([next_features, next_features[donor_rows]])
            position = torch.cat([position, position[donor_rows]])
            action = torch.cat([action, donor_action])
            reward = torch.cat([reward, donor_reward])
            done = torch.cat([done, done[donor_rows]])
            weights = torch.cat([weights, torch.ones(self.n_donors, device=self.device)])
        obs = torch.cat([features, position[:, None]], dim=1)
        next_obs = torch.cat([next_features, self.positions[action][:, None]], dim=1)
        sampled = obs[: self.batch_size]
        obs_do = sampled.clone()
        obs_do[:, self.non_causal] = sampled[permutation][:, self.non_causal]
        return PeerBatch(
            obs=obs,
            next_obs=next_obs,
            obs_do=obs_do,
            action=action,
            reward=reward,
            discount=cfg.loss.gamma * (1.0 - done),
            row_weights=weights,
            indices=indices,
        )

    # ------------------------------------------------------------------ losses
    def losses(self, batch: PeerBatch) -> tuple[Any, dict[str, Any]]:
        """Loss parts [3] = (L_mse, L_c51, L_causal unweighted) and aux tensors."""
        torch, cfg = self.torch, self.cfg
        net, loss_cfg = cfg.network, cfg.loss
        z = self.support
        rows = batch.obs.shape[0]
        n_sampled = batch.obs_do.shape[0]
        eff, new_u = self._effective(self.params)
        use_causal = self.non_causal.numel() > 0 and loss_cfg.causal_weight > 0
        inputs = [batch.obs, batch.next_obs] + ([batch.obs_do] if use_causal else [])
        logits_all = self._apply(eff, torch.cat(inputs))
        logits = logits_all[:rows]  # [R, A, N]
        logits_next = logits_all[rows : 2 * rows].detach()
        log_probs = torch.log_softmax(logits, dim=-1)
        q = torch.sum(torch.exp(log_probs) * z, dim=-1)  # [R, A]
        with torch.no_grad():
            q_next = torch.sum(torch.softmax(logits_next, dim=-1) * z, dim=-1)
            target_eff, _ = self._effective(self.target)  # stored u; its update is discarded
            probs_target = torch.softmax(self._apply(target_eff, batch.next_obs), dim=-1)
            a_star = torch.argmax(q_next, dim=-1)
            probs_star = probs_target[torch.arange(rows, device=self.device), a_star]  # [R, N]
            q_star = torch.sum(probs_star * z, dim=-1)
            tz = torch.clamp(
                batch.reward[:, None] + batch.discount[:, None] * z, net.v_min, net.v_max
            )
            hat = torch.clamp(
                1.0 - torch.abs(tz[:, :, None] - z[None, None, :]) / net.delta_z, 0, 1
            )
            projected = torch.einsum("rj,rji->ri", probs_star, hat)  # [R, N]
            eps = loss_cfg.label_smoothing
            target = (1.0 - eps) * projected + eps / net.n_atoms
            y = torch.clamp(batch.reward + batch.discount * q_star, net.v_min, net.v_max)
        q_taken = torch.gather(q, 1, batch.action[:, None])[:, 0]
        logits_taken = logits[torch.arange(rows, device=self.device), batch.action]  # [R, N]
        mse = ((q_taken - y) / (net.v_max - net.v_min)) ** 2
        c51 = -torch.sum(target * torch.log_softmax(logits_taken, dim=-1), dim=-1)
        loss_mse = torch.mean(batch.row_weights * mse)
        loss_c51 = torch.mean(batch.row_weights * c51)
        if use_causal:
            log_p = torch.log_softmax(logits[:n_sampled], dim=-1).detach()
            log_q = torch.log_softmax(logits_all[2 * rows :], dim=-1)
            loss_causal = torch.mean(torch.sum(torch.exp(log_p) * (log_p - log_q), dim=-1))
        else:
            loss_causal = torch.zeros((), device=self.device)
        aux = {"new_u": new_u, "q": q, "q_taken": q_taken, "y": y}
        return torch.stack([loss_mse, loss_c51, loss_causal]), aux

    def part_gradients(self, batch: PeerBatch) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Flat gradients of (1-alpha) L_mse, alpha L_c51 and the causal term; loss parts."""
        torch, loss_cfg = self.torch, self.cfg.loss
        parts, aux = self.losses(batch)
        causal_on = (self.step_count % loss_cfg.causal_every == 0).to(torch.float32)
        objectives = [
            (1.0 - self.alpha) * parts[0],
            self.alpha * parts[1],
            loss_cfg.causal_weight * causal_on * parts[2],
        ]
        flats = []
        for i, objective in enumerate(objectives):
            grads = torch.autograd.grad(objective, self.flat_params, retain_graph=i < 2)
            flats.append(torch.cat([g.reshape(-1) for g in grads]))
        return flats[0], flats[1], flats[2], parts, aux

    # ------------------------------------------------------------------ step
    def step(self) -> Any:
        """One learner step; returns the loss parts [3] (a device tensor, no sync)."""
        torch, cfg = self.torch, self.cfg
        loss_cfg = cfg.loss
        batch = self.sample()
        g_mse, g_c51, g_extra, parts, aux = self.part_gradients(batch)

        # Gradient vaccine (Wang et al., 2021), applied every gv_every steps by a select.
        n1, n2 = torch.linalg.vector_norm(g_mse), torch.linalg.vector_norm(g_c51)
        u1 = g_mse / torch.where(n1 > 0, n1, torch.ones_like(n1))
        u2 = g_c51 / torch.where(n2 > 0, n2, torch.ones_like(n2))
        phi = torch.clamp(torch.dot(u1, u2), -1.0, 1.0)
        skip = (n1 == 0) | (n2 == 0) | (n2 < 1e-8 * n1)
        due = self.step_count % loss_cfg.gv_every == 0
        applied = (phi < self.phi_hat) & ~skip & due
        sin_phi = torch.sqrt(torch.clamp((1 - phi) * (1 + phi), min=0.0))
        sin_hat = torch.sqrt(torch.clamp((1 - self.phi_hat) * (1 + self.phi_hat), min=0.0))
        ratio = (self.phi_hat * sin_phi - phi * sin_hat) / torch.clamp(sin_hat, min=1e-6)
        zero = torch.zeros_like(ratio)
        g1 = g_mse + torch.where(applied, n1 * ratio, zero) * u2
        g2 = g_c51 + torch.where(applied, n2 * ratio, zero) * u1
        ema = torch.clamp(
            (1 - loss_cfg.gv_beta) * self.phi_hat + loss_cfg.gv_beta * phi, -0.99, 0.99
        )
        phi_hat = torch.where(due & ~skip, ema, self.phi_hat)

        # Down-only budget: shares 0.3 / 0.7 while C51 is on, 1 / 0 otherwise.
        c51_on = self.alpha > 0
        share_mse = torch.where(c51_on, loss_cfg.budget_share_mse, 1.0)
        share_c51 = torch.where(c51_on, 1.0 - loss_cfg.budget_share_mse, 0.0)
        for_budget = []
        for g, share in ((g1, share_mse), (g2, share_c51)):
            limit = share * loss_cfg.grad_budget
            norm = torch.linalg.vector_norm(g)
            scale = torch.where(norm > limit, limit / torch.where(norm > 0, norm, 1.0), 1.0)
            for_budget.append(g * torch.clamp(scale, max=1.0))
        grad_total = for_budget[0] + for_budget[1] + g_extra

        # Guard snapshot, Adam, masks, guard select.
        old = [p.detach().clone() for p in self.flat_params]
        offsets = 0
        for p in self.flat_params:
            n = p.numel()
            p.grad = grad_total[offsets : offsets + n].view_as(p)
            offsets += n
        states = [self.optimizer.state[p] for p in self.flat_params if p in self.optimizer.state]
        old_moments = [(s["exp_avg"].clone(), s["exp_avg_sq"].clone()) for s in states]
        self.optimizer.step()
        with torch.no_grad():
            for name in self.layers:
                for key in ("kernel", "bias"):
                    self.params[name][key].mul_(self.masks[name][key])
            q_abs_max = torch.max(torch.abs(aux["q"]))
            ok = (
                torch.isfinite(parts).all()
                & torch.isfinite(grad_total).all()
                & torch.stack([torch.isfinite(p).all() for p in self.flat_params]).all()
                & (q_abs_max <= loss_cfg.q_clip)
            )
            for p, o in zip(self.flat_params, old, strict=True):
                p.copy_(torch.where(ok, p, o))
            for s, (m, v) in zip(states, old_moments, strict=True):
                s["exp_avg"].copy_(torch.where(ok, s["exp_avg"], m))
                s["exp_avg_sq"].copy_(torch.where(ok, s["exp_avg_sq"], v))
            for name, u in aux["new_u"].items():
                self.sn_u[name].copy_(torch.where(ok, u, self.sn_u[name]))
            self.phi_hat.copy_(torch.where(ok, phi_hat, self.phi_hat))

            # Hard target sync every target_every steps (a select: no host branch).
            next_step = self.step_count + 1
            sync = ok & (next_step % cfg.optim.target_every == 0)
            for name in self.layers:
                for key in ("kernel", "bias"):
                    t = self.target[name][key]
                    t.copy_(torch.where(sync, self.params[name][key], t))

            # PER priorities of the sampled rows: clear, then scatter-max.
            td = torch.abs(aux["y"] - aux["q_taken"])[: self.batch_size]
            new_p = torch.clamp(
                torch.nan_to_num(td, nan=0.0) + cfg.replay.priority_eps,
                cfg.replay.priority_eps,
                cfg.replay.priority_max,
            )
            priorities = self.replay["priorities"]
            updated = priorities.index_fill(0, batch.indices, 0.0)
            updated = updated.scatter_reduce(0, batch.indices, new_p, reduce="amax")
            priorities.copy_(torch.where(ok, updated, priorities))
            max_priority = self.replay["max_priority"]
            max_priority.copy_(
                torch.where(ok, torch.maximum(max_priority, new_p.max()), max_priority)
            )
            self.step_count.add_(1)
        return parts


def torch_argsort_rand(torch: Any, n: int, device: Any) -> Any:
    """A uniform random permutation without host sync (``randperm`` is not graph-capturable)."""
    return torch.argsort(torch.rand(n, device=device))


def peer_from_state(cfg: Config, non_causal: tuple[int, ...], state: Any, device: str) -> TorchPeer:
    """A :class:`TorchPeer` holding the same parameters, ``u`` and buffer as a jdqn LearnerState."""
    import jax

    host = jax.device_get(state)
    replay = {
        k: np.asarray(v) for k, v in host.replay.transitions._asdict().items() if v is not None
    }
    replay["priorities"] = np.asarray(host.replay.priorities)
    replay["max_priority"] = np.asarray(host.replay.max_priority)
    as_np = lambda tree: jax.tree.map(np.asarray, tree)
    return TorchPeer(
        cfg,
        non_causal,
        as_np(host.params),
        as_np(host.target_params),
        as_np(host.sn_u),
        replay,
        device=device,
    )


def time_peer(peer: TorchPeer, n_steps: int, repeats: int, graph: bool) -> dict[str, float]:
    """Microseconds per step (median over ``repeats`` runs of ``n_steps``), eager or graphed."""
    torch = peer.torch
    cuda = peer.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    run_one = peer.step
    if graph:
        if not cuda:
            raise ValueError("CUDA-graph capture needs a CUDA device")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up on a side stream, as capture requires
                peer.step()
        torch.cuda.current_stream().wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        # thread_local: CUDA calls from other threads of this process (JAX's runtime threads
        # run here too) must not invalidate the capture, as one did on the H200.
        with torch.cuda.graph(captured, capture_error_mode="thread_local"):
            peer.step()
        run_one = captured.replay
    for _ in range(3):
        run_one()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n_steps):
            run_one()
        sync()
        times.append(time.perf_counter() - start)
    return {
        "us_per_step": 1e6 * statistics.median(times) / n_steps,
        "us_per_step_min": 1e6 * min(times) / n_steps,
        "n_steps": n_steps,
        "repeats": repeats,
    }


def run(quick: bool = False, cfg: Config | None = None) -> list[dict[str, Any]]:
    """Rows ``torch eager`` (and ``torch CUDA graph`` on a GPU); empty when torch is absent."""
    if not available():
        return []
    import torch

    from jdqn.bench.fixture import NON_CAUSAL, filled_learner
    from jdqn.config import SMOKETEST

    cfg = cfg or SMOKETEST
    _, state = filled_learner(cfg)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n_steps, repeats = (20, 3) if quick else (300, 5)
    rows = []
    modes = [False] + ([True] if device == "cuda" else [])
    for graph in modes:
        peer = peer_from_state(cfg, NON_CAUSAL, state, device)
        timing = time_peer(peer, n_steps, repeats, graph)
        rows.append(
            {
                "impl": f"torch {torch.__version__} " + ("CUDA graph" if graph else "eager"),
                "device": device,
                **timing,
            }
        )
    return rows


def ratio_table(jdqn_rows: list[dict[str, Any]], peer_rows: list[dict[str, Any]]) -> str:
    """jdqn's per-call and in-scan rows beside the peer's, with how much faster jdqn is."""
    from jdqn.bench import markdown_table

    per_call, in_scan = (r["us_per_step"] for r in jdqn_rows[:2])
    cells = [(f"jdqn {r['mode']}", f"{r['us_per_step']:.1f}", "", "") for r in jdqn_rows]
    cells += [
        (
            f"{r['impl']} ({r['device']})",
            f"{r['us_per_step']:.1f}",
            f"{r['us_per_step'] / per_call:.1f}x",
            f"{r['us_per_step'] / in_scan:.1f}x",
        )
        for r in peer_rows
    ]
    header = (
        "implementation",
        "us/step",
        "jdqn per call is faster by",
        "jdqn in-scan is faster by",
    )
    return markdown_table(header, cells)


def main(argv: list[str] | None = None) -> None:
    import argparse

    from jdqn import bench
    from jdqn.bench import suite

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.json and (problem := bench.json_problem(args.json)):
        parser.error(problem)
    if not available():
        raise SystemExit("benchmarks.torch_peer: torch is not importable here")
    jdqn_rows = suite.SECTIONS["learner_step"](args.quick, suite.BENCH_CONFIG)["rows"]
    peer_rows = run(args.quick, suite.BENCH_CONFIG)
    print(ratio_table(jdqn_rows, peer_rows))
    if args.json:
        bench.write_json(args.json, {"jdqn": jdqn_rows, "peer": peer_rows})


if __name__ == "__main__":
    from jdqn.accel.xla_flags import configure

    configure()  # jdqn's XLA flags, before JAX starts a backend
    main()
