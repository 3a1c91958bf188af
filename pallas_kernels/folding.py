"""Vmapped calls as one kernel launch: the one vmap rule of the kernels whose every argument has
a leading axis (the flat tail's learners, the C51 projection's rows), folding mapped axes into
it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def learner_folding(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``kernel`` (pytrees of arrays with a leading learner axis ``[L, ...]`` in, a pytree out)
    with a vmap rule that folds the mapped axis into ``L``: nested vmaps end in one launch. An
    unmapped argument is broadcast to the mapped axis first."""

    @jax.custom_batching.custom_vmap
    def run(*args: Any) -> Any:
        return kernel(*args)

    @run.def_vmap
    def _fold(axis_size: int, in_batched: Any, *args: Any) -> tuple[Any, Any]:
        def lead(a: jax.Array, batched: bool) -> jax.Array:
            return a if batched else jnp.broadcast_to(a, (axis_size, *a.shape))

        args = jax.tree.map(lead, args, tuple(in_batched))
        learners = jax.tree.leaves(args)[0].shape[1]
        out = run(*jax.tree.map(lambda a: a.reshape(axis_size * learners, *a.shape[2:]), args))
        out = jax.tree.map(lambda x: x.reshape(axis_size, learners, *x.shape[1:]), out)
        return out, jax.tree.map(lambda _: True, out)

    return run
