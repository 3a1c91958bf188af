"""``jdqn bench``: every benchmark section in one run; prints tables and writes JSON (issue 6).

Sections (run in this order; ``--only NAME`` picks some):

- ``learner_step``: the smoketest learner step, all components on: per call from a Python loop
  (the usual jit-per-step pattern) vs inside ``lax.scan``.
- ``seeds``: S vmapped learners (S in 1, 16, 128, 1024), seed-steps per second.
- ``walkforward``: the README main command's work, cold and warm compilation cache, in fresh
  processes.
- ``breakdown``: where the step's time goes (variants with one component off, differenced).
- ``kernels``: every kernel of the in-scan step with its device time and the part of the step
  that launched it (``jdqn.bench.kernels``, command buffers off, in a fresh process).
- ``torch_peer``: the same step in PyTorch, eager and CUDA-graph captured (when torch imports);
  the jdqn/peer ratios use jdqn's numbers measured in the same run.
- ``projection``, ``replay``, ``data_pipeline``: the component benchmarks of their own modules.
- ``scaling``: seed-steps per second on 1..N devices, weak and strong (``jdqn.bench.scaling``).

Absolute times depend on the machine; the ratios (jdqn vs the peer, in-scan vs per call) are the
figures to compare across runs.
"""

from __future__ import annotations

import datetime
import json
import platform
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from jdqn.bench import breakdown, scaling, seeds, torch_peer, walkforward_run
from jdqn.config import SMOKETEST, Config

# Goals of issue 6 on the H200 (us, seed-steps/s, s).
GOAL_IN_SCAN_US = 25.0
GOAL_SEED_STEPS_PER_S = 2_000_000
GOAL_COLD_S, GOAL_WARM_S = 10.0, 3.0
GOAL_TRAINING_COMPILE_S = 10.0


def _learner_step_rows(quick: bool, cfg: Config) -> dict[str, Any]:
    """Section 1 through ``jdqn.bench.learner_step`` (per call vs in-scan, same learner)."""
    from jdqn.bench import learner_step

    detail = (
        learner_step.run(cfg, n_scan=50, repeats=20, scan_repeats=2)
        if quick
        else learner_step.run(cfg, n_scan=1000, repeats=200, scan_repeats=5)
    )
    rows = [
        {
            "mode": "per call (Python loop)",
            "us_per_step": detail["per_call_us"],
            "compile_s": detail["compile_step_s"],
        },
        {
            "mode": "in lax.scan",
            "us_per_step": detail["in_scan_us"],
            "compile_s": detail["compile_scan_s"],
        },
        {
            "mode": f"in lax.scan, {detail['unroll']} steps per loop trip",
            "us_per_step": detail["in_scan_unrolled_us"],
            "compile_s": detail["compile_scan_unrolled_s"],
        },
    ]
    return {"rows": rows, "detail": detail, "table": learner_step.table(detail)}


def _seeds(quick: bool, cfg: Config) -> dict[str, Any]:
    return {"rows": seeds.run(quick, cfg)}


def _walkforward(quick: bool, cfg: Config) -> dict[str, Any]:
    del cfg  # the main command's own profile (smoketest)
    return {"rows": walkforward_run.run(quick)}


def _breakdown(quick: bool, cfg: Config) -> dict[str, Any]:
    return {"rows": breakdown.run(quick, cfg), "kernel_census": breakdown.kernel_census(cfg)}


def _kernels(quick: bool, cfg: Config) -> dict[str, Any]:
    del cfg  # the profiler's own fixture: the smoketest step
    from jdqn.bench import kernels

    result = kernels.run_without_command_buffers(n_steps=5 if quick else 200)
    rows = [{"scope": scope, **figures} for scope, figures in result["scopes"].items()]
    return {"rows": rows, "detail": result, "table": kernels.table(result, top=15)}


def _torch_peer(quick: bool, cfg: Config) -> dict[str, Any]:
    if not torch_peer.available():
        return {"rows": [], "skipped": "torch is not importable here (not a jdqn dependency)"}
    return {"rows": torch_peer.run(quick, cfg), "includes": torch_peer.__doc__.split("\n\n")[1]}


def _fmt_peer(result: dict[str, Any], jdqn_rows: list[dict[str, Any]]) -> str:
    if not result["rows"] or len(jdqn_rows) < 2:
        return f"skipped: {result.get('skipped', 'no peer rows or no jdqn rows')}"
    lines = [
        "| implementation | us/step | jdqn per call is faster by | jdqn in-scan is faster by |"
    ]
    lines.append("|---|---|---|---|")
    per_call, in_scan = (r["us_per_step"] for r in jdqn_rows[:2])
    for r in jdqn_rows:
        lines.append(f"| jdqn {r['mode']} | {r['us_per_step']:.1f} | | |")
    for r in result["rows"]:
        lines.append(
            f"| {r['impl']} ({r['device']}) | {r['us_per_step']:.1f} | "
            f"{r['us_per_step'] / per_call:.1f}x | {r['us_per_step'] / in_scan:.1f}x |"
        )
    return "\n".join(lines)


def _projection(quick: bool, cfg: Config) -> dict[str, Any]:
    from jdqn.bench import projection

    on_gpu = jax.default_backend() == "gpu"
    # The smoketest/default batch sizes at 51 atoms; the full sweep is `python -m
    # jdqn.bench.projection` (its Pallas compiles alone outlast a bench run's time budget).
    sizes = ((64, 51),) if quick or not on_gpu else ((64, 51), (4096, 51), (65536, 51))
    impls = projection.IMPLS if on_gpu else ("xla_hat", "xla_scatter")
    rows = projection.run(sizes=sizes, repeats=5 if quick else 20, impls=impls)
    return {"rows": rows, "table": projection.format_table(rows)}


def _replay(quick: bool, cfg: Config) -> dict[str, Any]:
    from jdqn.bench import replay

    sizes = ((256, 64),) if quick else replay.SIZES
    rows = [
        replay.bench_size(capacity, batch, breakdown.N_FEATURES, 5 if quick else 50, 100)
        for capacity, batch in sizes
    ]
    return {"rows": rows}


def _data_pipeline(quick: bool, cfg: Config) -> dict[str, Any]:
    from jdqn.bench import data_pipeline

    timings = data_pipeline.run(n_bars=12_000 if quick else 60_000, repeats=1 if quick else 3)
    return {"rows": [timings]}


def _fmt_rows(rows: list[dict[str, Any]]) -> str:
    """Generic markdown table of flat rows (numbers to 4 significant digits)."""
    if not rows:
        return "(no rows)"
    keys = [k for k in rows[0] if not isinstance(rows[0][k], dict | list)]
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


SECTIONS: dict[str, Callable[[bool, Config], dict[str, Any]]] = {
    "learner_step": _learner_step_rows,
    "seeds": _seeds,
    "walkforward": _walkforward,
    "breakdown": _breakdown,
    "kernels": _kernels,
    "torch_peer": _torch_peer,
    "projection": _projection,
    "replay": _replay,
    "data_pipeline": _data_pipeline,
    "scaling": scaling.section,
}


def _format(name: str, result: dict[str, Any], results: dict[str, Any]) -> str:
    if name == "seeds":
        return seeds.format_table(result["rows"])
    if name == "walkforward":
        return walkforward_run.format_table(result["rows"])
    if name == "breakdown":
        census = ", ".join(f"{k} {v}" for k, v in result["kernel_census"].items())
        return (
            breakdown.format_table(result["rows"])
            + f"\n\noptimised HLO of one in-scan step (top-level instructions): {census}"
        )
    if name == "torch_peer":
        return _fmt_peer(result, results.get("learner_step", {}).get("rows", []))
    if "table" in result:
        return result["table"]
    return _fmt_rows(result["rows"])


def _goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 6's goals against what this run measured (they are stated for the H200)."""
    goals = []

    def add(name: str, value: float, limit: float, lower_is_better: bool = True) -> None:
        met = value <= limit if lower_is_better else value >= limit
        goals.append({"goal": name, "measured": value, "limit": limit, "met": met})

    def has(name: str) -> bool:
        return bool(results.get(name, {}).get("rows"))

    if has("learner_step"):
        # The one-step-per-trip row: the scan training runs (the unrolled row is a diagnostic
        # of what a loop trip costs; BENCHMARKS.md, "U3").
        add(
            "in-scan learner step us",
            results["learner_step"]["rows"][1]["us_per_step"],
            GOAL_IN_SCAN_US,
        )
    if has("seeds"):
        big = max(results["seeds"]["rows"], key=lambda r: r["seeds"])
        add(
            f"seed-steps/s at S={big['seeds']}",
            big["seed_steps_per_s"],
            GOAL_SEED_STEPS_PER_S,
            lower_is_better=False,
        )
    if has("walkforward"):
        cold, warm = results["walkforward"]["rows"]
        add("main command cold s (process wall)", cold["process_wall_s"], GOAL_COLD_S)
        add("main command warm s (process wall)", warm["process_wall_s"], GOAL_WARM_S)
        add(
            "training-program compile s (cold)", cold["training_compile_s"], GOAL_TRAINING_COMPILE_S
        )
    return goals


def _meta(quick: bool) -> dict[str, Any]:
    device = jax.devices()[0]
    meta = {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        "device": getattr(device, "device_kind", str(device)),
        "python": platform.python_version(),
        "host": platform.node(),
        "quick": quick,
    }
    if torch_peer.available():
        import torch

        meta["torch_version"] = torch.__version__
    return meta


def _write_json(json_path: str, output: dict[str, Any]) -> None:
    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(json_path).write_text(json.dumps(output, indent=2, default=float) + "\n")


def run_all(
    sections: list[str],
    json_path: str | None,
    quick: bool,
    cfg: Config | None = None,
    echo: Callable[[str], None] = print,
    keep_going: bool = True,
) -> dict[str, Any]:
    """Run ``sections`` (empty = all, in :data:`SECTIONS` order), print a table per section and
    the goals, write JSON to ``json_path`` if given, and return the results.

    ``cfg`` (default: the smoketest profile) is the learner's config for the step sections; tests
    pass a tiny one. A section that raises is recorded (``error``, ``traceback``) and the others
    still run, unless ``keep_going`` is False. Unknown section names raise ``ValueError``
    listing the valid ones."""
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise ValueError(
            f"bench --only {unknown[0]!r}: unknown section; valid sections: {list(SECTIONS)}"
        )
    chosen = [s for s in SECTIONS if not sections or s in sections]
    if "torch_peer" in chosen and "learner_step" not in chosen:
        chosen.insert(0, "learner_step")  # the peer's ratios need jdqn measured in this run
    cfg = cfg or SMOKETEST
    output: dict[str, Any] = {"meta": _meta(quick), "sections": {}}
    echo(
        f"jdqn bench: {output['meta']['device']} ({output['meta']['backend']}), "
        f"jax {jax.__version__}, sections {chosen}{' (quick)' if quick else ''}"
    )
    for name in chosen:
        start = time.perf_counter()
        try:
            result = SECTIONS[name](quick, cfg)
        except Exception as error:  # one broken section must not lose the others' numbers
            if not keep_going:
                raise
            result = {"rows": [], "error": f"{type(error).__name__}: {error}"}
            result["traceback"] = traceback.format_exc()[-4000:]
        result["section_s"] = time.perf_counter() - start
        output["sections"][name] = result
        echo(f"\n## {name} ({result['section_s']:.0f} s)\n")
        if "error" in result:
            echo(f"FAILED: {result['error']}\n{result['traceback']}")
        else:
            echo(_format(name, result, output["sections"]))
        if json_path:  # after every section, so a run cut short keeps what it measured
            _write_json(json_path, output)
    output["goals"] = _goals(output["sections"])
    if output["goals"]:
        echo("\n## goals (issue 6; stated for the H200)\n")
        for goal in output["goals"]:
            echo(
                f"- {goal['goal']}: {goal['measured']:,.1f} (goal {goal['limit']:,}) "
                f"{'met' if goal['met'] else 'NOT met'}"
            )
    if json_path:
        _write_json(json_path, output)
        echo(f"\njdqn bench: wrote {json_path}")
    return output
