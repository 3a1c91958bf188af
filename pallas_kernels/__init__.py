"""GPU kernels (Pallas), each with a pure-jnp reference and a dispatch."""

from pallas_kernels.c51_projection import c51_project, c51_project_reference

__all__ = ["c51_project", "c51_project_reference"]
