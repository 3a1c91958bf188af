"""Lowering a jitted function for CUDA on any machine (an abstract H200), shared by the Pallas
kernel tests: the Triton lowering runs at this point, so a construct or shape the GPU backend
rejects fails here, on CPU CI too. Also: where a jaxpr launches Pallas kernels."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np

# Emitted when a Pallas Triton kernel is lowered for CUDA on jax 0.11 (the backend is deprecated
# upstream in favour of Mosaic GPU); the lowering itself is what the tests check.
TRITON_DEPRECATION = "ignore:The Pallas Triton backend is deprecated:DeprecationWarning"


def lower_for_h200(fn, *shapes):
    """StableHLO text of ``jax.jit(fn)`` lowered for CUDA on float32 arguments of ``shapes``."""
    device = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=None, platform="gpu")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)
    args = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in shapes]
    with jax.sharding.use_abstract_mesh(mesh):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def pallas_call_sizes(jaxpr) -> list[int]:
    """The size of the first operand of every ``pallas_call`` in ``jaxpr`` (a core jaxpr),
    nested jaxprs included, in order: how many launches, and over how much."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            out.append(int(np.prod(eqn.invars[0].aval.shape)))
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            out.extend(pallas_call_sizes(sub))
    return out
