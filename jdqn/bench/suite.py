"""``jdqn bench``: the jit-compiled benchmark of docs/design.md; prints tables and writes JSON.

Sections (run in this order; ``--only NAME`` picks some):

- ``learner_step``: the smoketest learner step, all components on: per call from a Python loop
  (the usual jit-per-step pattern) vs inside ``lax.scan``.
- ``seeds``: S vmapped learners (S in 1, 16, 128, 1024), seed-steps per second.
- ``walkforward``: the README main command, cold and warm compilation cache, in fresh processes.
- ``learning``: the learning scorecard (``jdqn.bench.learning``): the default profile's agent
  against the baselines on a martingale, planted edges, a cost sweep and the ES sample.
- ``scaling``: seed-steps per second on 1..N devices, weak and strong (``jdqn.bench.scaling``).

Absolute times depend on the machine; ratios measured in one run (in-scan vs per call) are the
figures to compare across runs. Research probes (where the step's time goes, the PyTorch peer,
kernel lists, the critical path, deviceless compiles, timelines, kernel sweeps) live in the
repository's ``benchmarks/`` folder.
"""

from __future__ import annotations

import datetime
import platform
import time
import traceback
from collections.abc import Callable
from typing import Any

import jax

from jdqn import bench
from jdqn.bench import learning, markdown_table, scaling, seeds, walkforward_run
from jdqn.config import SMOKETEST, Config, apply_overrides

# The step every speed section times: the smoketest learner with the seed's donors (the
# hindsight-best action, a quarter of the batch) and its fixed 0.3 / 0.7 budget split. The torch
# peer implements exactly this step, and it keeps the figures comparable across versions; the
# profiles' own donors for every action make the batch 3x larger.
BENCH_CONFIG = apply_overrides(
    SMOKETEST, ["loss.donor_mode=best", "loss.donor_fraction=0.25", "loss.budget_split=fixed"]
)


def _learner_step_rows(quick: bool, cfg: Config) -> dict[str, Any]:
    """Section 1 through ``jdqn.bench.learner_step`` (per call vs in-scan, same learner)."""
    from jdqn.bench import learner_step

    detail = (
        learner_step.run(cfg, n_scan=50, repeats=20, scan_repeats=2)
        if quick
        else learner_step.run(cfg, n_scan=1000, repeats=200, scan_repeats=5)
    )
    modes = (
        ("per call (Python loop)", "per_call_us", "compile_step_s"),
        ("in lax.scan", "in_scan_us", "compile_scan_s"),
    )
    rows = [{"mode": m, "us_per_step": detail[us], "compile_s": detail[c]} for m, us, c in modes]
    return {"rows": rows, "detail": detail, "table": learner_step.table(detail)}


def _seeds(quick: bool, cfg: Config) -> dict[str, Any]:
    rows = seeds.run(quick, cfg)
    return {"rows": rows, "table": seeds.format_table(rows)}


def _walkforward(quick: bool, cfg: Config) -> dict[str, Any]:
    del cfg  # the main command's own profile (smoketest)
    rows = walkforward_run.run(quick)
    return {"rows": rows, "table": walkforward_run.format_table(rows)}


def _fmt_rows(rows: list[dict[str, Any]]) -> str:
    """Generic markdown table of flat rows (numbers to 4 significant digits)."""
    if not rows:
        return "(no rows)"
    keys = [k for k in rows[0] if not isinstance(rows[0][k], dict | list)]
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
    return markdown_table(keys, [[fmt(r.get(k, "")) for k in keys] for r in rows])


# Each returns its "rows" and, but for a plain list of rows (:func:`_fmt_rows`), its "table".
SECTIONS: dict[str, Callable[[bool, Config], dict[str, Any]]] = {
    "learner_step": _learner_step_rows,
    "seeds": _seeds,
    "walkforward": _walkforward,
    "learning": learning.section,
    "scaling": scaling.section,
}


OPT_IN = ("learning",)


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
    return meta


def run_all(
    sections: list[str],
    json_path: str | None,
    quick: bool,
    cfg: Config | None = None,
    echo: Callable[[str], None] = print,
    keep_going: bool = True,
) -> dict[str, Any]:
    """Run ``sections`` (empty = all, in :data:`SECTIONS` order), print a table per section,
    write JSON to ``json_path`` if given, and return the results.

    ``cfg`` (default: the smoketest profile) is the learner's config for the step sections; tests
    pass a tiny one. A section that raises is recorded (``error``, ``traceback``) and the others
    still run, unless ``keep_going`` is False. Unknown section names raise ``ValueError``
    listing the valid ones."""
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise ValueError(
            f"bench --only {unknown[0]!r}: unknown section; valid sections: {list(SECTIONS)}"
        )
    # The scorecard trains many walk-forwards: it runs when asked for (--only learning).
    chosen = [s for s in SECTIONS if s in sections or (not sections and s not in OPT_IN)]
    cfg = cfg or BENCH_CONFIG
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
            echo(result["table"] if "table" in result else _fmt_rows(result["rows"]))
        if json_path:  # after every section, so a run cut short keeps what it measured
            bench.write_json(json_path, output)
    if json_path:
        bench.write_json(json_path, output)
        echo(f"\njdqn bench: wrote {json_path}")
    return output
