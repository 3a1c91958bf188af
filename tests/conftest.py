"""Shared test settings: float32 JAX on CPU, autotuning off on the GPU, no hypothesis deadlines
(JIT compiles are slow)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# On the GPU the suite compares transformations of one computation (jit vs eager, vmap vs
# separate runs); they agree to float rounding only when both programs use the same GEMM
# algorithms. jdqn's runtime default autotunes them (jdqn/accel/xla_flags.py),
# and on the H200 that moved jit-vs-eager gradient norms by 3e-5 and the vaccine cosine by 1e-4
# so the tests turn the autotuner off. A level set in XLA_FLAGS wins; no-op on CPU.
_flags = os.environ.get("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
if "--xla_gpu_autotune_level" not in _flags:
    _flags += " --xla_gpu_autotune_level=0"
os.environ["XLA_FLAGS"] = _flags

# What the jdqn command does first (import jdqn changes nothing): jdqn's XLA flags, before the
# first test starts a backend; in-process runs then compile as the command's do.
from jdqn.accel.xla_flags import configure  # noqa: E402

configure()

# Compiled programs persist across tests, workers and the runs' subprocesses (the command's cache,
# $JDQN_CACHE_DIR): a learner built again in another test loads its executable, not compiling it.
from jdqn.config import Config  # noqa: E402
from jdqn.run.walkforward import enable_compilation_cache  # noqa: E402

enable_compilation_cache(Config())

from hypothesis import settings  # noqa: E402

settings.register_profile("jdqn", deadline=None, max_examples=25, derandomize=True)
settings.load_profile("jdqn")
