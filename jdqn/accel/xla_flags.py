"""XLA flags jdqn sets (:func:`configure`) before JAX starts its backend: fast and reproducible
GPU programs (docs/design.md §10, §11).

- Autotuning stays on. XLA times candidate GEMM and fusion algorithms as it compiles and keeps
  the fastest; a close race can go either way, so two compiles can sum in different orders, and
  training amplifies a last-bit difference. Processes that load the same compiled programs (the
  compilation cache under :func:`cache_root`, where JAX also keeps the autotuner's results) agree
  bit for bit; fresh compiles may not. ``--xla_gpu_autotune_level=0`` (set by the user) tunes
  nothing, and fresh compiles agree, at a cost in speed (docs/performance.md, "Reproducibility").
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

A flag or ``XLA_PYTHON_CLIENT_PREALLOCATE`` the user already set wins.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SCHEDULING_FLAG = "--xla_gpu_command_buffer_scheduling_mode"
DOT_MERGER_FLAG = "--xla_gpu_dot_merger_threshold_mb"
CPU_YNN_FUSIONS_FLAG = "--xla_cpu_experimental_ynn_fusion_type"
PREALLOCATE_VAR = "XLA_PYTHON_CLIENT_PREALLOCATE"


def cache_root() -> Path:
    """jdqn's cache directory: ``$JDQN_CACHE_DIR``, else ``~/.cache/jdqn/xla``. The compilation
    cache lives there (``jdqn.run.walkforward.enable_compilation_cache``), and with it JAX's
    autotune results (``xla_gpu_per_fusion_autotune_cache_dir``)."""
    return Path(os.environ.get("JDQN_CACHE_DIR") or Path.home() / ".cache" / "jdqn" / "xla")


def with_gpu_flags(xla_flags: str) -> str:
    """``XLA_FLAGS`` with jdqn's flags (module docstring) added where the user has not set them."""
    flags = xla_flags.split()
    names = {flag.partition("=")[0] for flag in flags}
    ours = [f"{SCHEDULING_FLAG}=CONCURRENT", f"{DOT_MERGER_FLAG}=0", f"{CPU_YNN_FUSIONS_FLAG}="]
    return " ".join(flags + [flag for flag in ours if flag.partition("=")[0] not in names])


def configure() -> bool:
    """Sets ``XLA_FLAGS`` and on-demand GPU memory for this process (the module docstring says
    what each gives): the ``jdqn`` command and ``run_walkforward`` call it first; a notebook or
    script that runs jdqn's programs itself calls ``jdqn.configure()`` before its first JAX
    computation. XLA reads these only when a backend starts, so once one has started it changes
    nothing and returns False."""
    if _backend_started():
        return False
    os.environ.setdefault(PREALLOCATE_VAR, "false")
    os.environ["XLA_FLAGS"] = with_gpu_flags(os.environ.get("XLA_FLAGS", ""))
    return True


def _backend_started() -> bool:
    if "jax" not in sys.modules:  # nothing can have started one
        return False
    from jax._src import xla_bridge  # no public API tells whether a backend started

    return bool(xla_bridge.backends_are_initialized())
