"""XLA flags jdqn sets before JAX starts its backend: reproducible GPU programs (DESIGN section 10).

XLA's GPU autotuner times candidate GEMM/fusion algorithms while compiling and keeps the fastest,
and which one wins varies from one compile to the next; algorithms differ in summation order, so
two fresh processes with the same seed gave different walk-forward numbers on the H200 (training
amplifies a last-bit difference). With ``--xla_gpu_autotune_level=0`` every compile picks the same
algorithms and fresh processes agree bit for bit (BENCHMARKS.md, "Reproducibility on the GPU").
The flag is a no-op on CPU. A level the user already put in ``XLA_FLAGS`` wins.
"""

from __future__ import annotations

import os

REPRODUCIBLE_GPU_FLAGS: tuple[str, ...] = ("--xla_gpu_autotune_level=0",)


def with_reproducible_gpu_flags(xla_flags: str) -> str:
    """``XLA_FLAGS`` value with jdqn's flags added where the user has not set them."""
    flags = xla_flags.split()
    for flag in REPRODUCIBLE_GPU_FLAGS:
        name = flag.split("=", 1)[0]
        if not any(existing.split("=", 1)[0] == name for existing in flags):
            flags.append(flag)
    return " ".join(flags)


def apply_reproducible_gpu_flags() -> None:
    """Sets ``XLA_FLAGS`` for this process; takes effect if no JAX backend has started yet."""
    os.environ["XLA_FLAGS"] = with_reproducible_gpu_flags(os.environ.get("XLA_FLAGS", ""))
