"""Choose the ``default`` profile's settings by sweeps on development data only.

    python scripts/choose_default.py --out runs/choice [--seeds 8] [--path 1] [--grid KEY=V1,V2 ...]
        [--measure validation|test] [--martingale-paths 0,1,...,9] [--edges planted_0.3,cost_2x]
        [--jobs N]

Runs one ``jdqn sweep`` of the same grid on each development case (each of ``--edges``, the
scorecard's cases, on development path ``--path``; a martingale on ``--path`` and on each of
``--martingale-paths``; and the ES sample), then ranks the settings on their
validation tails (the last 30 % of each fold's train window, ``jdqn sweep``'s default), or with
``--measure test`` on the development path's test windows. The validation runs train on the train
window less its tail and a purge gap, so a setting that interacts with the amount of training
(epochs, buffer, learning rate) is better judged on the test windows, where it trained on the whole
train windows as a walk-forward does; with a development path, those are development data too. A
setting is eligible where it meets the scorecard's martingale goal on every martingale path (median
exposure at most 10 %, at least 95 % of seed-folds within $2,500 of flat per 12,000 bars), or, if
none does, those with the lowest worst-path median exposure; among them the highest sum over the
edges of the median net wins (each edge's best tuned baseline is the same for every setting, so
this is also the highest sum of agent minus baseline). (One path can mislead: MSE only sat out path
1's martingale and held positions on path 0's.) Evaluation paths (``jdqn.bench.learning``'s
``EVALUATION_PATHS``) are refused: they judge the choice and never make it. Writes ``choice.json``
in ``--out`` and prints every setting's row. ``--grid`` (repeated) replaces :data:`GRID`, e.g. for
a later choice among fewer keys on top of the current profile.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from jdqn.bench import run_processes
from jdqn.bench.learning import (
    CASES,
    DEVELOPMENT_PATHS,
    ES_SAMPLE,
    EVALUATION_PATHS,
    SITTING_OUT_EXPOSURE,
    SITTING_OUT_WITHIN_BAND,
    sitting_out,
)

GRID = (
    "network.post_trade_values=false,true",
    "env.train_cost_scale=1,2,4",
    "train.act_risk=0,0.5",
)
EDGES = ("planted_0.3",)  # the development edge of the earlier choices
# The command's defaults: the cases of the latest choice (docs/performance.md), ten martingale
# paths since one or five passed a setting that a sixth did not.
RULE_EDGES = ("planted_0.3", "planted_0.2", "cost_2x", "reversion_0.3")
RULE_MARTINGALE_PATHS = tuple(range(10))


def case_flags(
    path: int, martingale_paths: tuple[int, ...] = (), edges: tuple[str, ...] = EDGES
) -> dict[str, list[str]]:
    """Each development case's ``jdqn sweep`` flags: each of ``edges`` on ``path``, ``martingale``
    on ``path`` (its name in earlier choices), ``martingale_<p>`` on each other of
    ``martingale_paths``."""
    es = [o for o in CASES["es_sample"] if not o.startswith("data.path=")]
    flags = {
        edge: [f"--set={o}" for o in CASES[edge]] + [f"--set=data.synthetic_seed={path}"]
        for edge in edges
    }
    for p in (path, *(p for p in martingale_paths if p != path)):
        name = "martingale" if p == path else f"martingale_{p}"
        flags[name] = [f"--set={o}" for o in (*CASES["martingale"], f"data.synthetic_seed={p}")]
    flags["es_sample"] = ["--data", str(ES_SAMPLE), *(f"--set={o}" for o in es)]
    return flags


def read_rows(sweep_dir: Path, keys: list[str]) -> dict[tuple[str, ...], list[dict[str, str]]]:
    """sweep.csv's rows grouped by setting (the grid keys' values)."""
    rows: dict[tuple[str, ...], list[dict[str, str]]] = {}
    with (sweep_dir / "sweep.csv").open() as handle:
        for row in csv.DictReader(handle):
            rows.setdefault(tuple(row[k] for k in keys), []).append(row)
    return rows


def summarise(rows: list[dict[str, str]], measure: str = "validation") -> dict[str, Any]:
    """Medians over a setting's seed-folds of its ``measure`` runs (``validation`` or ``test``,
    sweep.csv's column prefixes); a halted run fails every share."""
    metrics = ("net_pnl_usd", "exposure", "n_trades", "n_bars")
    agent = [
        {m: float(r[f"{measure}_{m}"]) for m in metrics}
        for r in rows
        if r[f"{measure}_status"] == "ok"
    ]
    shares = sitting_out(agent, len(rows))
    changes = shares["changes_per_1000_bars"]
    return {
        "runs": len(rows),
        "net_usd": statistics.median(a["net_pnl_usd"] for a in agent) if agent else None,
        "exposure": shares["exposure"],
        "changes_per_bar": None if changes is None else changes / 1_000,
        "share_within_flat_band": shares["share_within_flat_band"],
    }


def choose(
    table: dict[tuple[str, ...], dict[str, dict[str, Any]]],
    edges: tuple[str, ...] = EDGES,
) -> tuple[str, ...]:
    """The rule in the module docstring: a setting is judged by its worst martingale path."""

    def martingales(s: tuple[str, ...]) -> list[dict[str, Any]]:
        return [c for name, c in table[s].items() if name.startswith("martingale")]

    def worst(s: tuple[str, ...]) -> float | None:
        paths = [c["exposure"] for c in martingales(s)]
        return None if None in paths else max(paths)

    def in_band(s: tuple[str, ...]) -> bool:
        return all(c["share_within_flat_band"] >= SITTING_OUT_WITHIN_BAND for c in martingales(s))

    exposure = {s: worst(s) for s in table}
    known = {s: e for s, e in exposure.items() if e is not None}
    eligible = [s for s, e in known.items() if e <= SITTING_OUT_EXPOSURE and in_band(s)]
    if not eligible:
        lowest = min(known.values())
        eligible = [s for s, e in known.items() if e == lowest]

    def planted(s: tuple[str, ...]) -> float:
        nets = [table[s][edge]["net_usd"] for edge in edges]
        return float("-inf") if None in nets else sum(nets)  # every run of an edge halted: last

    return max(eligible, key=planted)


def sweep_command(
    args: argparse.Namespace, case: str, flags: list[str], grid: tuple[str, ...]
) -> list[str]:
    """``jdqn sweep`` of ``grid`` on one development case, or its resumption where a sweep of it
    was cut short."""
    killed = args.out / f"{case}.incomplete"
    command = [sys.executable, "-m", "jdqn", "sweep", "--no-progress"]
    if killed.is_dir():
        return [*command, "--resume", str(killed)]
    command += ["--profile", args.profile, "--seeds", str(args.seeds)]
    command += ["--out", str(args.out), "--name", case]
    return [*command, *(f"--set={o}" for o in args.set), *flags, *(f"--grid={g}" for g in grid)]


def paths(text: str) -> tuple[int, ...]:
    """``--martingale-paths``: comma-separated path numbers (argparse reports a bad one)."""
    return tuple(int(p) for p in text.split(",") if p.strip())


def jobs(text: str) -> int:
    """``--jobs``: a whole number of at least 1 (argparse reports a bad one)."""
    if (value := int(text)) < 1:
        raise ValueError(text)
    return value


def edges(text: str) -> tuple[str, ...]:
    """``--edges``: comma-separated scorecard cases with an edge (argparse reports a bad one)."""
    names = tuple(e.strip() for e in text.split(",") if e.strip())
    if not names or any(e not in CASES or e in ("martingale", "es_sample") for e in names):
        raise ValueError(text)
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--path", type=int, default=DEVELOPMENT_PATHS[1])
    parser.add_argument("--profile", default="default")
    parser.add_argument(
        "--set", action="append", default=[], help="passed to every sweep before its case's own"
    )
    parser.add_argument("--grid", action="append", help=f"KEY=V1,V2 (default {' '.join(GRID)})")
    parser.add_argument(
        "--martingale-paths", type=paths, default=RULE_MARTINGALE_PATHS,
        help=f"development paths (default {','.join(map(str, RULE_MARTINGALE_PATHS))})",
    )  # fmt: skip
    parser.add_argument(
        "--edges", type=edges, default=RULE_EDGES,
        help=f"scorecard cases run on --path (default {','.join(RULE_EDGES)})",
    )  # fmt: skip
    parser.add_argument(
        "--jobs", type=jobs, default=1,
        help="sweeps run at once, each its own process (e.g. 4 on one GPU); output in <case>.log",
    )  # fmt: skip
    parser.add_argument(
        "--measure", choices=("validation", "test"), default="validation",
        help="rank on the validation tails (default) or on the development path's test windows",
    )  # fmt: skip
    args = parser.parse_args()
    grid = tuple(args.grid or GRID)
    keys = [g.partition("=")[0] for g in grid]
    martingale_paths: tuple[int, ...] = args.martingale_paths
    for path in (args.path, *martingale_paths):
        if path in EVALUATION_PATHS:
            print(f"path {path} is an evaluation path; fix: use development paths, e.g. 0,1,2")
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    cases = case_flags(args.path, martingale_paths, args.edges)
    commands = {
        case: sweep_command(args, case, flags, grid)
        for case, flags in cases.items()
        if not (args.out / case / "sweep.csv").is_file()
    }
    try:
        failed = run_processes(commands, args.jobs, args.out)
    except KeyboardInterrupt:
        print("choose_default: interrupted; run the same command to resume")
        return 130
    if failed is not None:  # jdqn sweep has said why in one line (in <case>.log with --jobs)
        print(f"choose_default: the {failed[0]} sweep stopped; run the same command to resume")
        return failed[1]
    table: dict[tuple[str, ...], dict[str, dict[str, Any]]] = {}
    for case in cases:
        for setting, rows in read_rows(args.out / case, keys).items():
            table.setdefault(setting, {})[case] = summarise(rows, args.measure)
    chosen = choose(table, args.edges)
    for setting, cases in table.items():
        mark = "*" if setting == chosen else " "
        print(mark, dict(zip(keys, setting, strict=True)), json.dumps(cases))
    rows = [{"setting": dict(zip(keys, s, strict=True)), **c} for s, c in table.items()]
    record = {"grid": grid, "path": args.path, "martingale_paths": martingale_paths,
              "edges": args.edges, "seeds": args.seeds, "measure": args.measure,
              "chosen": dict(zip(keys, chosen, strict=True)), "table": rows}  # fmt: skip
    (args.out / "choice.json").write_text(json.dumps(record, indent=1) + "\n")
    print("chosen:", record["chosen"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
