"""XLA flags jdqn sets (:func:`configure`) before JAX starts its backend: fast and reproducible
GPU programs (docs/design.md §10, §11).

- Autotuning stays on, with a per-fusion autotune cache next to the compilation cache meant to
  persist its choices: the winning GEMM/fusion algorithm (and so the summation order) can vary
  between compiles, and training amplifies a last-bit difference. Under jax 0.11.2 on an H100
  that directory stayed empty through the ``default`` profile's programs and two compiles gave
  other numbers, so processes agree bit for bit only where they load the same compiled programs
  (the compilation cache). Level 0 tunes nothing, but XLA's default GEMM configurations are much
  slower at many vmapped seeds.
- CUDA graphs (one per scan iteration) are ordered by the kernels' buffer uses (``CONCURRENT``,
  not XLA's single chain ``LHS``), so kernels that share no buffer run side by side; only their
  start order changes, not their arithmetic.
- The dot merger is off (threshold 0): it stacked the head's backward over the loss parts' and the
  causal term's rows, a concatenation pass of its own at many learners (float32 rounding differs).
- GPU memory is taken on demand (``XLA_PYTHON_CLIENT_PREALLOCATE=false``): reserving 75 % at the
  first transfer held up each process's first device operation and starved a second run on the
  GPU; the allocator (BFC), and so the program's speed, is the same.
- On CPU, YNNPACK fusions (off: ``--xla_cpu_experimental_ynn_fusion_type=``) sum in an order that
  depends on the batch's size, so a run sharded over devices drifted from the one-device run.

A flag or ``XLA_PYTHON_CLIENT_PREALLOCATE`` the user already set wins (an explicit autotune level
also drops the cache).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

AUTOTUNE_CACHE_FLAG = "--xla_gpu_per_fusion_autotune_cache_dir"
AUTOTUNE_LEVEL_FLAG = "--xla_gpu_autotune_level"
SCHEDULING_FLAG = "--xla_gpu_command_buffer_scheduling_mode"
DOT_MERGER_FLAG = "--xla_gpu_dot_merger_threshold_mb"
CPU_YNN_FUSIONS_FLAG = "--xla_cpu_experimental_ynn_fusion_type"
PREALLOCATE_VAR = "XLA_PYTHON_CLIENT_PREALLOCATE"


def cache_root() -> Path:
    """jdqn's cache directory: ``$JDQN_CACHE_DIR``, else ``~/.cache/jdqn/xla``. The compilation
    cache lives there (``jdqn.run.walkforward.enable_compilation_cache``), autotune results
    below."""
    return Path(os.environ.get("JDQN_CACHE_DIR") or Path.home() / ".cache" / "jdqn" / "xla")


def with_gpu_flags(xla_flags: str, autotune_dir: Path | None) -> str:
    """``XLA_FLAGS`` with jdqn's flags (module docstring) added where the user has not set them;
    no autotune cache without ``autotune_dir`` or when the user sets an autotune level."""
    flags = xla_flags.split()
    names = {flag.partition("=")[0] for flag in flags}
    ours = [f"{SCHEDULING_FLAG}=CONCURRENT", f"{DOT_MERGER_FLAG}=0", f"{CPU_YNN_FUSIONS_FLAG}="]
    if autotune_dir is not None and AUTOTUNE_LEVEL_FLAG not in names:  # level 0 tunes nothing
        ours.append(f"{AUTOTUNE_CACHE_FLAG}={autotune_dir}")
    return " ".join(flags + [flag for flag in ours if flag.partition("=")[0] not in names])


def configure() -> bool:
    """Sets ``XLA_FLAGS`` and on-demand GPU memory for this process (the module docstring says
    what each gives): the ``jdqn`` command and ``run_walkforward`` call it first; a notebook or
    script that runs jdqn's programs itself calls ``jdqn.configure()`` before its first JAX
    computation. XLA reads these only when a backend starts, so once one has started it changes
    nothing and returns False. Without a writable cache directory no autotune cache is added."""
    if _backend_started():
        return False
    os.environ.setdefault(PREALLOCATE_VAR, "false")
    wanted = cache_root() / "autotune"
    try:
        wanted.mkdir(parents=True, exist_ok=True)
        autotune_dir: Path | None = wanted
    except OSError:
        autotune_dir = None
    os.environ["XLA_FLAGS"] = with_gpu_flags(os.environ.get("XLA_FLAGS", ""), autotune_dir)

    return True


def _backend_started() -> bool:
    if "jax" not in sys.modules:  # nothing can have started one
        return False
    from jax._src import xla_bridge  # no public API tells whether a backend started

    return bool(xla_bridge.backends_are_initialized())
