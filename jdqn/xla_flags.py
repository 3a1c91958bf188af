"""XLA flags jdqn sets before JAX starts its backend: fast and reproducible GPU programs
(docs/design.md §10, §11).

Autotuning stays on, with its choices persisted in a per-fusion autotune cache next to the
compilation cache. Which GEMM/fusion algorithm wins can vary between compiles, and algorithms sum
in different orders, so two fresh processes with the same seed could train apart (training
amplifies a last-bit difference); turning autotuning off (level 0) fixes that but leaves XLA's
default GEMM configurations, which are much slower at many vmapped seeds. With the cache the first
compile of a fusion times and records, later compiles in any process read the record, so
processes that share it pick the same algorithms and agree bit for bit.

CUDA graphs (XLA's command buffers, one per scan iteration) are built from the kernels' buffer
uses (``CONCURRENT``) instead of XLA's default single chain (``LHS``): kernels that touch no
common buffer, such as the target net's forward and the online net's reductions, run side by
side. Only their start order changes, not their arithmetic.

XLA's dot merger is off (threshold 0): it stacked the head's backward over the loss parts' and the
causal term's cotangent rows, which cost a concatenation pass of its own at many learners. The
results differ from the merged program's by float32 rounding.

GPU memory is taken on demand (``XLA_PYTHON_CLIENT_PREALLOCATE=false``) instead of reserving 75 %
of the GPU at the first transfer: the reservation held up each process's first device operation
and left a second run on the same GPU a quarter of the memory. The allocator (XLA's BFC) is the
same, so the training program's speed does not change.

On CPU, XLA's YNNPACK fusions sum reductions in an order that depends on the whole batch's size,
so a run sharded over several devices (fewer learners per program) drifted from the one-device
run by float32 rounding. With them off (``--xla_cpu_experimental_ynn_fusion_type=``, empty) a
sharded run equals the one-device run bit for bit (``jdqn.placement``).

The GPU flags are no-ops on CPU (the cache directory is still created at ``import jdqn``). A flag
the user already put in ``XLA_FLAGS`` wins (an explicit ``--xla_gpu_autotune_level=0`` restores
the uncached, autotuning-free behaviour; ``--xla_gpu_command_buffer_scheduling_mode=LHS`` XLA's
graph order; ``--xla_gpu_dot_merger_threshold_mb=32`` XLA's dot merging), and so does their
own ``XLA_PYTHON_CLIENT_PREALLOCATE`` (``true`` restores the reservation).
"""

from __future__ import annotations

import os
from pathlib import Path

AUTOTUNE_CACHE_FLAG = "--xla_gpu_per_fusion_autotune_cache_dir"
AUTOTUNE_LEVEL_FLAG = "--xla_gpu_autotune_level"
SCHEDULING_FLAG = "--xla_gpu_command_buffer_scheduling_mode"
DOT_MERGER_FLAG = "--xla_gpu_dot_merger_threshold_mb"
CPU_YNN_FUSIONS_FLAG = "--xla_cpu_experimental_ynn_fusion_type"
PREALLOCATE_VAR = "XLA_PYTHON_CLIENT_PREALLOCATE"


def cache_root() -> Path:
    """jdqn's cache directory: ``$JDQN_CACHE_DIR``, else ``~/.cache/jdqn/xla``. The compilation
    cache lives there (``jdqn.walkforward.enable_compilation_cache``), autotune results below."""
    return Path(os.environ.get("JDQN_CACHE_DIR") or Path.home() / ".cache" / "jdqn" / "xla")


def gpu_flags(autotune_dir: Path | None) -> tuple[str, ...]:
    """The flags jdqn adds: CUDA graphs built from the kernels' buffer uses, no dot merging,
    no YNNPACK fusions on CPU, and the persistent per-fusion autotune cache in ``autotune_dir``
    (none without a directory)."""
    flags: tuple[str, ...] = (
        f"{SCHEDULING_FLAG}=CONCURRENT",
        f"{DOT_MERGER_FLAG}=0",
        f"{CPU_YNN_FUSIONS_FLAG}=",
    )
    if autotune_dir is not None:
        flags += (f"{AUTOTUNE_CACHE_FLAG}={autotune_dir}",)
    return flags


def _name(flag: str) -> str:
    return flag.split("=", 1)[0]


def with_gpu_flags(xla_flags: str, autotune_dir: Path | None) -> str:
    """``XLA_FLAGS`` value with jdqn's flags added where the user has not set them. A user who
    sets an autotune level gets exactly that: no cache is added (level 0 tunes nothing)."""
    flags = xla_flags.split()
    names = {_name(existing) for existing in flags}
    for flag in gpu_flags(autotune_dir):
        if _name(flag) == AUTOTUNE_CACHE_FLAG and AUTOTUNE_LEVEL_FLAG in names:
            continue
        if _name(flag) not in names:
            flags.append(flag)
    return " ".join(flags)


def apply_gpu_flags() -> None:
    """Sets ``XLA_FLAGS`` and on-demand GPU memory for this process; takes effect if no JAX
    backend has started yet. Without a writable cache directory no autotune cache is added."""
    os.environ.setdefault(PREALLOCATE_VAR, "false")
    wanted = cache_root() / "autotune"
    try:
        wanted.mkdir(parents=True, exist_ok=True)
        autotune_dir: Path | None = wanted
    except OSError:
        autotune_dir = None
    os.environ["XLA_FLAGS"] = with_gpu_flags(os.environ.get("XLA_FLAGS", ""), autotune_dir)
