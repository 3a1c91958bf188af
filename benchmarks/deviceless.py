"""The learner's scan program compiled for an H200 on a machine without a GPU: what XLA:GPU
makes of a change (layouts, copies, kernels) before device time is spent timing it.

XLA compiles for a GPU it does not have from a target description (JAX's deviceless AOT path,
``jax.experimental.topologies`` with a ``target_config``), given JAX's CUDA plugin. Layout
assignment, fusion and code generation run as on the device; autotuning cannot (nothing to time
on), so the tool sets ``--xla_gpu_autotune_level=0``. Layouts are assigned before autotuning and
do not depend on it; GEMM configurations do, and so can a GEMM that the autotuner would have
given to cuBLAS, so kernel counts here are close to the device's, not equal. Pallas asks the
device for its compute capability, which a deviceless compile cannot answer: the tool gives
Pallas's Triton lowering the H200's (a private JAX function,
``jax._src.pallas.triton.gpu_info.get_gpu_info``, replaced for this process only).

It was checked against the H200: the copy that layout
assignment puts in front of the head's kernel-gradient GEMM on c07abfb, and the cotangent
written twice on e06ac41, come out the same here.

    pip install --target DIR jax-cuda12-plugin==0.11.2 jax-cuda12-pjrt==0.11.2
    PYTHONPATH=.:DIR python -m benchmarks.deviceless [--seeds 1024] [--set KEY=VALUE ...]
        [--out DIR] [--target-config FILE]

Prints the scan body's kernels and longest chain (``benchmarks.critical_path``), the copies
layout assignment added, and the program's dot instructions in the order layout assignment
visits them (in one layout log the first of the head's two backward GEMMs in that order set the
layout of the cotangent both read). ``--out`` keeps the optimised HLO and the
HLO before and after layout assignment. ``--target-config`` takes a GPU's own description
(``*.gpu_target_config.pbtxt`` in an ``--xla_dump_to`` directory written on that GPU); the
built-in one is an H200's from its data sheet.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.critical_path import analyse
from jdqn.accel.xla_flags import configure

# An H200's description for XLA's cost models: 132 SMs of compute capability 9.0, 50 MB of L2,
# 4.8 TB/s, 141 GB (NVIDIA's data sheet); the other fields are Hopper's limits.
H200_TARGET_CONFIG = """\
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 4800000000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 150323855360
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {
    major: 9
  }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info {
  major: 9
  minor: 8
}
runtime_version {
  major: 12
  minor: 8
  patch: 0
}
device_description_str: "NVIDIA H200"
"""

PLUGIN = "jax_plugins.xla_cuda12"
PLUGIN_FIX = (
    "pip install --target DIR jax-cuda12-plugin==0.11.2 jax-cuda12-pjrt==0.11.2, "
    "then run with PYTHONPATH=.:DIR"
)
MODULE = "jit_run"  # the scan program's name (jdqn.bench.fixture.scan_steps_fn's ``run``)
_DOT = re.compile(r"^\s*%([\w.\-]+) = (\w+\[[^\]]*\])\S* dot\(")


def dots_in_order(hlo_text: str) -> list[tuple[str, str]]:
    """``(name, shape)`` of every dot in an HLO text, in the text's order: the computations'
    post order, in which layout assignment added the dots' operand constraints in the layout log
    (and then propagated them from the earliest on)."""
    return [(m[1], m[2]) for line in hlo_text.splitlines() if (m := _DOT.match(line))]


def copies(hlo_text: str) -> int:
    """How many ``copy`` instructions an HLO text holds (after layout assignment: the layout
    changes it could not avoid)."""
    return sum(1 for line in hlo_text.splitlines() if re.search(r"= \S+ copy\(", line))


def _environment(dump: Path) -> None:
    """A CUDA backend with no device, dumping the scan program's HLO around layout assignment;
    before JAX starts a backend."""
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"  # no CUDA runtime to check
    os.environ.pop("JAX_PLATFORMS", None)
    os.environ["XLA_FLAGS"] = " ".join(
        [
            os.environ.get("XLA_FLAGS", ""),
            "--xla_gpu_autotune_level=0",
            f"--xla_dump_to={dump}",
            f"--xla_dump_hlo_module_re=^{MODULE}$",
            "--xla_dump_hlo_pass_re=layout-assignment",
        ]
    )


def compile_deviceless(
    overrides: Sequence[str], n_seeds: int, target_config: str, n_steps: int = 8
) -> str:
    """Optimised HLO of the bench's scan of ``n_seeds`` vmapped learner steps, compiled for the
    GPU ``target_config`` describes."""
    import jax
    from jax._src.pallas.triton import gpu_info
    from jax.experimental import topologies

    from jdqn.accel import choose
    from jdqn.agent import make_learner
    from jdqn.bench.fixture import scan_steps_fn
    from jdqn.config import SMOKETEST, apply_overrides

    topology = topologies.get_topology_desc(
        platform="cuda", target_config=target_config, topology="1x1x1"
    )
    device_kind: str = getattr(topology.devices[0], "device_kind", "")
    version = gpu_info.gpu_version_from_device_kind(device_kind)
    if version is None:
        raise ValueError(f"Pallas knows no GPU named {device_kind!r} (the target config's)")
    info = gpu_info._get_gpu_info_impl(version)
    gpu_info.get_gpu_info = lambda: info  # Pallas's Triton lowering asks the device otherwise
    mesh = topologies.make_mesh(topology, (1,), ("x",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    cfg = apply_overrides(SMOKETEST, list(overrides))
    # The tail "auto" picks on the GPU: this process's default backend is the CPU.
    tail = choose(cfg, backend="gpu", debug=False, learners=n_seeds).tail
    forced = ",".join(filter(None, (cfg.accel.pieces, f"tail={tail}")))
    cfg = apply_overrides(cfg, [f"accel.pieces={forced}"])
    learner = make_learner(cfg, 15, (0, 1, 2), learners=n_seeds)
    keys = jax.random.split(jax.random.PRNGKey(0), n_seeds)
    abstract = jax.eval_shape(jax.vmap(learner.init), keys)
    state: Any = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), abstract
    )
    fn = scan_steps_fn(learner, n_steps, vmapped=True)
    return fn.lower(state).compile().as_text() or ""


def _dumped(dump: Path, stage: str) -> str:
    found = sorted(dump.glob(f"*.{MODULE}.*{stage}*.txt"))
    if not found:
        raise FileNotFoundError(f"no {stage} dump of {MODULE} in {dump}")
    return found[0].read_text()


def report(optimised: str, before_layout: str, after_layout: str) -> str:
    """Markdown: kernels and chain of the scan body, copies, dots in layout assignment's order."""
    result = analyse(optimised)
    lines = [
        f"scan body: {result['kernels']} kernels per iteration, longest chain "
        f"{result['depth']} kernels",
        f"copies after layout assignment: {copies(after_layout)} (before: {copies(before_layout)})",
        "",
        "| # | dot | shape |",
        "|---|---|---|",
    ]
    for i, (name, shape) in enumerate(dots_in_order(before_layout), 1):
        lines.append(f"| {i} | {name} | {shape} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=None, help="keep the HLO texts here")
    parser.add_argument("--target-config", type=Path, default=None)
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="config override KEY=VALUE"
    )
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    if args.target_config is not None and not args.target_config.is_file():
        parser.error(f"--target-config {args.target_config}: no such file")
    if not _has_plugin():
        sys.exit(f"error: JAX's CUDA plugin is not importable; fix: {PLUGIN_FIX}")
    config = H200_TARGET_CONFIG if args.target_config is None else args.target_config.read_text()
    with tempfile.TemporaryDirectory() as scratch:
        dump = Path(scratch) if args.out is None else args.out
        dump.mkdir(parents=True, exist_ok=True)
        _environment(dump)
        try:
            optimised = compile_deviceless(args.overrides, args.seeds, config)
        except ValueError as error:
            parser.error(str(error))
        if args.out is not None:
            (dump / f"{MODULE}.optimised.txt").write_text(optimised)
        print(report(optimised, _dumped(dump, "before_layout"), _dumped(dump, "after_layout")))


def _has_plugin() -> bool:
    try:
        return importlib.util.find_spec(PLUGIN) is not None
    except ModuleNotFoundError:
        return False


if __name__ == "__main__":
    configure()  # jdqn's XLA flags, before JAX starts a backend
    main()
