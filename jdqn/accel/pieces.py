"""Which implementation each speed piece runs: :class:`Pieces`, a static description that
:func:`jdqn.accel.choose` makes once and the step passes down, as Pallas ops take ``interpret=``.

Nothing reads the environment, so what a function traces depends on its arguments alone. It
imports nothing of jdqn, so every module holding a piece imports it without a cycle.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax


@dataclasses.dataclass(frozen=True)
class Pieces:
    """Each piece's implementation, resolved (hashable: a static argument of traced code)."""

    # pallas_kernels.c51_project: the Pallas kernel, in interpret mode, or the jnp formula
    projection: Literal["pallas", "interpret", "reference"] = "reference"
    # the update's flat tail (jdqn.accel): pallas_kernels.flat_tail, or optax and jnp
    tail: Literal["pallas", "interpret", "xla"] = "xla"
    # jdqn.agent.dense_stack's backward: hand-written with its vmap rule, or JAX's autodiff
    dense: Literal["custom", "autodiff"] = "custom"
    # jdqn.agent.losses.c51_head and causal_kl: closed-form custom_vjp gradients, or autodiff
    vjp: Literal["closed", "autodiff"] = "closed"
    # the layout- and fusion-steering lax.optimization_barrier calls (:meth:`barrier`)
    barriers: bool = True
    # jdqn.accel.executables: compiled programs stored on disk (on a GPU), or none
    executables: bool = True

    @property
    def fused_tail(self) -> bool:
        """Whether the update runs the flat tail's kernels (in interpret mode or not)."""
        return self.tail != "xla"

    def barrier[T](self, x: T) -> T:
        """``jax.lax.optimization_barrier(x)``, or ``x`` itself without barriers."""
        return jax.lax.optimization_barrier(x) if self.barriers else x


# The product's forms where no backend decides (the projection's jnp formula, XLA's tail).
PLAIN = Pieces()
