"""The in-scan learner step's critical path: the longest chain of kernels that must run one after
another inside one scan iteration.

Under ``--xla_gpu_command_buffer_scheduling_mode=CONCURRENT`` (jdqn's default) an iteration is
one CUDA graph whose kernels wait only for the kernels whose buffers they read, so independent
kernels can run side by side. Whether an iteration then lasts as long as its deepest chain or as
long as its kernel count takes is a measurement: on the H200 the time followed the count (~0.65
us per kernel) and not the chain. This tool gives
both figures for a change. It reads the compiled program's optimised HLO, takes the body of the
scan's while loop (the one with the largest known trip count) and counts, for every value, the
longest chain of kernels that produce it. Kernels are the instructions that launch GPU work:
fusions, custom calls (Pallas, cuBLAS), copies, sorts and any other unfused op; parameters,
tuples, bitcasts, constants and tuple indexing launch nothing. A ``call`` (XLA's command-buffer
outlining) and a ``conditional`` are followed into their computations; an inner ``while``
counts its body's chain once per known trip.

    python -m benchmarks.critical_path [--seeds 1] [--set KEY=VALUE ...] [--hlo FILE]

``--hlo FILE`` analyses a saved HLO text (``compiled.as_text()``) instead of compiling.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from benchmarks.kernels import scope_of
from jdqn.accel.xla_flags import configure

# Instructions that launch no GPU work.
FREE = frozenset(
    {
        "parameter",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "constant",
        "after-all",
        "opt-barrier",
        "add-dependency",
        "partition-id",
        "replica-id",
    }
)
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_ASSIGN = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_NAME = re.compile(r"%([\w.\-]+)")
_OPCODE = re.compile(r"^\s*([a-z][\w\-]*)\(")
_ATTR = re.compile(r"\b(calls|to_apply|body|condition|branch_computations)=(\{[^}]*\}|%?[\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_INDEX = re.compile(r"\bindex=(\d+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


class Instr(NamedTuple):
    name: str
    opcode: str
    operands: tuple[str, ...]
    called: dict[str, tuple[str, ...]]  # attribute -> computation names
    tuple_index: int | None  # get-tuple-element's index
    trip_count: int | None  # a while's known trip count
    op_name: str


class Computation(NamedTuple):
    name: str
    params: tuple[str, ...]  # parameter instructions, in parameter-number order
    instrs: tuple[Instr, ...]  # in text order (XLA prints operands before their users)
    root: str


class Link(NamedTuple):
    """One kernel on a chain, pointing to the chain before it (a persistent list)."""

    depth: int
    label: str
    op_name: str
    prev: Link | None


def _skip_shape(text: str) -> str:
    """``text`` after the instruction's shape (a tuple shape is a balanced parenthesis)."""
    text = text.lstrip()
    if not text.startswith("("):
        return text.split(" ", 1)[1] if " " in text else ""
    level = 0
    for i, ch in enumerate(text):
        level += {"(": 1, ")": -1}.get(ch, 0)
        if level == 0:
            return text[i + 1 :]
    raise ValueError(f"unbalanced tuple shape: {text[:80]}")


def _operands(text: str) -> tuple[str, str]:
    """``text`` starts at the opcode's "(": the operand list inside it, and the attributes after."""
    level = 0
    for i, ch in enumerate(text):
        level += {"(": 1, ")": -1}.get(ch, 0)
        if level == 0:
            return text[1:i], text[i + 1 :]
    raise ValueError(f"unbalanced operand list: {text[:80]}")


def parse_instr(line: str) -> tuple[Instr, bool] | None:
    """One HLO instruction line -> (instruction, is_root); None for any other line."""
    match = _ASSIGN.match(line)
    if not match:
        return None
    root, name, rest = match.groups()
    rest = _skip_shape(rest)
    opcode_match = _OPCODE.match(rest)
    if not opcode_match:
        return None
    opcode = opcode_match.group(1)
    inside, attrs = _operands(rest[opcode_match.end() - 1 :])
    called = {
        key: tuple(_NAME.findall(value) or [value.lstrip("%")])
        for key, value in _ATTR.findall(attrs)
    }
    index = _INDEX.search(attrs) if opcode == "get-tuple-element" else None
    trip = _TRIP.search(attrs) if opcode == "while" else None
    op_name = _OP_NAME.search(attrs)
    instr = Instr(
        name=name,
        opcode=opcode,
        operands=tuple(_NAME.findall(inside)),
        called=called,
        tuple_index=int(index.group(1)) if index else None,
        trip_count=int(trip.group(1)) if trip else None,
        op_name=op_name.group(1) if op_name else "",
    )
    return instr, bool(root)


def _param_number(line: str) -> int:
    match = re.search(r"parameter\((\d+)\)", line)
    return int(match.group(1)) if match else 0


def parse_module(text: str) -> dict[str, Computation]:
    """Every computation of an HLO module's text, by name."""
    computations: dict[str, Computation] = {}
    name: str | None = None
    instrs: list[Instr] = []
    params: dict[int, str] = {}
    root = ""
    for line in text.splitlines():
        if name is None:
            header = _HEADER.match(line)
            if header and "=" not in line.split("(", 1)[0]:
                name, instrs, params, root = header.group(1), [], {}, ""
            continue
        if line.strip() == "}":
            ordered = tuple(params[k] for k in sorted(params))
            computations[name] = Computation(name, ordered, tuple(instrs), root or instrs[-1].name)
            name = None
            continue
        parsed = parse_instr(line)
        if parsed is None:
            continue
        instr, is_root = parsed
        instrs.append(instr)
        if instr.opcode == "parameter":
            params[_param_number(line)] = instr.name
        if is_root:
            root = instr.name
    return computations


Depth = Any  # a Link or None for an array value; a list of those for a tuple value


def _deepest(values: Sequence[Depth]) -> Link | None:
    best: Link | None = None
    for value in values:
        for link in value if isinstance(value, list) else [value]:
            if isinstance(link, list):
                link = _deepest(link)
            if link is not None and (best is None or link.depth > best.depth):
                best = link
    return best


def _extend(link: Link | None, instr: Instr) -> Link:
    depth = 0 if link is None else link.depth
    return Link(depth + 1, f"{instr.name} ({instr.opcode})", instr.op_name, link)


def chain_through(
    module: dict[str, Computation], computation: str, inputs: Sequence[Depth]
) -> tuple[Depth, int]:
    """The root's chain(s) of ``computation`` given its parameters' chains, and its kernel count."""
    comp = module[computation]
    values: dict[str, Depth] = dict(zip(comp.params, inputs, strict=False))
    kernels = 0
    for instr in comp.instrs:
        args = [values.get(o) for o in instr.operands]
        if instr.opcode == "parameter":
            values.setdefault(instr.name, None)
        elif instr.opcode == "get-tuple-element":
            source = args[0] if args else None
            values[instr.name] = (
                source[instr.tuple_index]
                if isinstance(source, list) and instr.tuple_index is not None
                else source
            )
        elif instr.opcode == "tuple":
            values[instr.name] = list(args)
        elif instr.opcode in FREE:
            values[instr.name] = _deepest(args)
        elif instr.opcode == "call" and "to_apply" in instr.called:
            values[instr.name], n = chain_through(module, instr.called["to_apply"][0], args)
            kernels += n
        elif instr.opcode == "conditional" and "branch_computations" in instr.called:
            # Branch k takes operand k + 1 (operand 0 is the branch index or predicate).
            branches = [
                chain_through(module, branch, args[k + 1 : k + 2])
                for k, branch in enumerate(instr.called["branch_computations"])
            ]
            # Nothing of a branch runs before the predicate or index is known.
            values[instr.name] = _deepest([*(b[0] for b in branches), *args[:1]])
            kernels += max(b[1] for b in branches)
        elif instr.opcode == "while" and "body" in instr.called:
            state: Depth = args[0] if args else None
            n_body = 0
            for _ in range(instr.trip_count or 1):
                state, n_body = chain_through(module, instr.called["body"][0], [state])
            values[instr.name] = state
            kernels += n_body * (instr.trip_count or 1)
        else:
            values[instr.name] = _extend(_deepest(args), instr)
            kernels += 1
    return values[comp.root], kernels


def scan_body(module: dict[str, Computation]) -> str:
    """The body computation of the while loop with the largest known trip count."""
    loops = [
        instr
        for comp in module.values()
        for instr in comp.instrs
        if instr.opcode == "while" and "body" in instr.called
    ]
    if not loops:
        raise ValueError("the HLO has no while loop")
    best = max(loops, key=lambda w: w.trip_count or 0)
    return best.called["body"][0]


def analyse(hlo_text: str) -> dict[str, Any]:
    """Kernels per iteration of the scan's body, its longest chain, and that chain's kernels."""
    module = parse_module(hlo_text)
    body = scan_body(module)
    root, kernels = chain_through(module, body, [None])
    link = _deepest([root])
    chain = []
    while link is not None:
        chain.append(
            {"kernel": link.label, "op_name": link.op_name, "scope": scope_of(link.op_name)}
        )
        link = link.prev
    chain.reverse()
    per_scope = collections.Counter(k["scope"] for k in chain)
    return {
        "body": body,
        "kernels": kernels,
        "depth": len(chain),
        "chain": chain,
        "depth_per_scope": dict(per_scope.most_common()),
    }


def table(result: dict[str, Any]) -> str:
    """Markdown: the headline, the chain's kernels per scope, then the chain in order."""
    lines = [
        f"scan body `{result['body']}`: {result['kernels']} kernels per iteration, longest "
        f"chain {result['depth']} kernels",
        "",
        "| scope | kernels on the chain |",
        "|---|---|",
        *(f"| {scope} | {n} |" for scope, n in result["depth_per_scope"].items()),
        "",
        "| # | kernel | scope | op_name |",
        "|---|---|---|---|",
    ]
    for i, k in enumerate(result["chain"], 1):
        lines.append(f"| {i} | {k['kernel']} | {k['scope']} | {k['op_name'][-90:]} |")
    return "\n".join(lines)


def compiled_scan_hlo(overrides: Sequence[str], n_seeds: int, n_steps: int = 8) -> str:
    """Optimised HLO of the bench's scan of learner steps (as ``benchmarks.kernels`` times it)."""
    from jdqn.bench.fixture import filled_learner, scan_steps_fn
    from jdqn.config import SMOKETEST, apply_overrides

    cfg = apply_overrides(SMOKETEST, list(overrides))
    if n_seeds > 1:
        from jdqn.bench.seeds import seeded_states

        learner, state = seeded_states(cfg, n_seeds)
    else:
        learner, state = filled_learner(cfg)
    fn = scan_steps_fn(learner, n_steps, vmapped=n_seeds > 1)
    return fn.lower(state).compile().as_text() or ""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--hlo", type=Path, default=None, help="analyse this saved HLO text")
    parser.add_argument("--save-hlo", type=Path, default=None, help="write the compiled HLO here")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="config override KEY=VALUE"
    )
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    if args.hlo is not None and not args.hlo.is_file():
        parser.error(f"--hlo {args.hlo}: no such file; fix: give a saved HLO text")
    try:
        if args.hlo is not None:
            text = args.hlo.read_text()
        else:
            text = compiled_scan_hlo(args.overrides, args.seeds)
    except ValueError as error:
        parser.error(str(error))
    if args.save_hlo is not None:
        args.save_hlo.write_text(text)
    try:
        result = analyse(text)
    except ValueError as error:
        sys.exit(f"error: {error}")
    print(table(result))


if __name__ == "__main__":
    configure()  # jdqn's XLA flags, before JAX starts a backend
    main()
