"""Shared test settings: float32 JAX on CPU, no hypothesis deadlines (JIT compiles are slow)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

from hypothesis import settings  # noqa: E402

settings.register_profile("jdqn", deadline=None, max_examples=25, derandomize=True)
settings.load_profile("jdqn")
