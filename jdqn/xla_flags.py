"""XLA flags jdqn sets before JAX starts its backend: fast and reproducible GPU programs
(docs/design.md §10, §11).

XLA's GPU autotuner times candidate GEMM/fusion algorithms while compiling and keeps the fastest,
and which one wins can vary from one compile to the next; algorithms differ in summation order,
so two fresh processes with the same seed gave different walk-forward numbers on the H200
(training amplifies a last-bit difference). Turning autotuning off (level 0) fixes that but
leaves XLA's default GEMM configurations, which made 1,024 vmapped seeds 2.1x slower (7.9 vs
3.8 ms per step on the H200). jdqn keeps autotuning on and persists its choices in a per-fusion
autotune cache next to the compilation cache: the first compile of a fusion times and records,
every later compile in any process reads the record, so processes that share the cache pick the
same algorithms and agree bit for bit (checked on the H200).

Each scan iteration of a program runs as one CUDA graph (XLA's command buffers), and jdqn asks
XLA to build that graph from the kernels' buffer uses (``CONCURRENT``) instead of XLA's default
order (``LHS``, one chain on one stream): kernels that touch no common buffer, such as the target
net's forward and the online net's or the guard's reductions, then run side by side. On the H200
the in-scan learner step went from 149 to 98 us at one learner and from 2,741 to 2,641 us at
1,024 vmapped learners, with the same walk-forward numbers bit for bit: the kernels and their
arithmetic are the same, only their start order changes.

XLA's dot merger joins dots that share an operand into one dot over the concatenated other
operands (``--xla_gpu_dot_merger_threshold_mb``, 32 by XLA's default). In the learner it stacked
the head's backward over the loss parts' and the causal term's cotangent rows, which cost a
concatenation pass of its own at many learners; jdqn sets the threshold to 0 (no merging). On
the H200, 1,024 vmapped learners went from 2,374 to 2,263 us per step (-4.7 %), one learner from
97.8-98.0 to 95.8-97.3 us, and the training program compiled in 8.2 against 8.7 s. The folds differ
from the merged program's by float32 rounding (other GEMMs sum in another order); every process with
jdqn's flags compiles the same program.

GPU memory is taken on demand (``XLA_PYTHON_CLIENT_PREALLOCATE=false``) instead of JAX's default
of reserving 75 % of the GPU at the first transfer: on the H200 that reservation held up every
process's first device operation by ~1.4 s (2.0 s against 0.57 s), a large share of a warm
walk-forward run, and it left a second run on the same GPU a quarter of the memory. The
allocator is the same (XLA's BFC allocator; it grows its pool and reuses it), so the training
program's speed does not change.

On CPU, XLA hands reductions to YNNPACK fusions whose summation order depends on the whole
batch's size: a learner's sum of squares over its parameters came out differently in its last
bit when it was one of 10 vmapped learners than when it was one of 2, so a run sharded over
several devices (fewer learners in each program) drifted from the one-device run by float32
rounding. jdqn turns those fusions off (``--xla_cpu_experimental_ynn_fusion_type=``, empty):
XLA's own loops reduce each learner's row the same way at any learner count, and a sharded run
equals the one-device run bit for bit (``jdqn.placement``).

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
