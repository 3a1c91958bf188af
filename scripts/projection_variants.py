"""Times variants of the Pallas C51 projection against each other in one process (issue 5).

    python3 scripts/projection_variants.py [--ncu] [--default] [BxN ...]

Variants: ``window`` (the kernel in ``pallas_kernels``) at a few launch configs; earlier kernels
saved beside this script as ``_<name>.py`` (e.g. ``git show
30d6112:pallas_kernels/c51_projection.py > scripts/_prefix_30d6112.py``); ``tile_copy`` (the same
grid and masked [rows, padded atoms] tile loads and stores, no arithmetic: the floor of that
access pattern); and ``xla_scatter``. Times are kernel times from the profiler
(``jdqn.bench.projection.kernel_us``). ``--ncu`` runs each kernel once without timing, for
``ncu --kernel-name regex:c51``; ``--default`` times the default launch only.
"""

import argparse
import functools
import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

import pallas_kernels.c51_projection as window
from jdqn.bench.projection import V_MAX, V_MIN, kernel_us, make_inputs, parse_sizes

CONFIGS = ((512, 2), (512, 4), (1024, 2), (1024, 4), (2048, 4), (2048, 8), (4096, 8))


def _copy_kernel(probs_ref, rewards_ref, discounts_ref, out_ref, *, n_atoms, n_pad, block_rows):
    batch = probs_ref.shape[0]
    row0 = pl.program_id(0) * block_rows
    rows = row0 + jnp.arange(block_rows, dtype=jnp.int32)
    cols = jnp.arange(n_pad, dtype=jnp.int32)
    valid = (rows < batch)[:, None] & (cols < n_atoms)[None, :]
    block = (pl.ds(row0, block_rows), pl.ds(0, n_pad))
    plgpu.store(out_ref.at[block], plgpu.load(probs_ref.at[block], mask=valid) * 2.0, mask=valid)


def tile_copy(probs, rewards, discounts, block_elements, num_warps):
    batch, n_atoms = probs.shape
    n_pad = pl.next_power_of_2(n_atoms)
    block_rows = window._block_rows(batch, n_pad, block_elements)
    kernel = functools.partial(_copy_kernel, n_atoms=n_atoms, n_pad=n_pad, block_rows=block_rows)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(probs.shape, jnp.float32),
        grid=(pl.cdiv(batch, block_rows),),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        name="c51_tile_copy",
    )(probs, rewards, discounts)


def _earlier_kernels() -> dict:
    """Kernel modules saved beside this script as ``_<name>.py`` (``git show REV:path > ...``)."""
    modules = {}
    for path in sorted(Path(__file__).parent.glob("_*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules[path.stem.lstrip("_")] = module
    return modules


def variants(elements, warps):
    def pallas(module):
        return functools.partial(
            module.c51_project_pallas,
            v_min=V_MIN,
            v_max=V_MAX,
            interpret=False,
            block_elements=elements,
            num_warps=warps,
        )

    out = {"window": pallas(window)}
    out.update({name: pallas(module) for name, module in _earlier_kernels().items()})
    out["tile_copy"] = functools.partial(tile_copy, block_elements=elements, num_warps=warps)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=parse_sizes, help="BxN cases (262144x51)")
    parser.add_argument("--ncu", action="store_true", help="run each kernel once, no timing")
    parser.add_argument("--default", action="store_true", help="the default launch only")
    parser.add_argument(
        "--sweep-all", action="store_true", help="every launch config for every kernel variant"
    )
    args = parser.parse_args(argv)
    ncu = args.ncu
    sizes = [size for group in args.sizes for size in group] or [(262144, 51)]
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}", flush=True)
    print("| B | N | variant | block elements | warps | kernel us | max abs diff |", flush=True)
    for batch, n_atoms in sizes:
        inputs = make_inputs(jax.random.key(0), batch, n_atoms)
        check = window.c51_project(*inputs, V_MIN, V_MAX, impl="xla_scatter")
        for elements, warps in CONFIGS[:1] if ncu or args.default else CONFIGS:
            for name, project in variants(elements, warps).items():
                swept = name == "window" or (args.sweep_all and name != "tile_copy")
                if not swept and (elements, warps) != CONFIGS[0]:
                    continue
                fn = jax.jit(project)
                diff = float(jnp.max(jnp.abs(fn(*inputs) - check)))
                if not ncu:
                    print(
                        f"| {batch} | {n_atoms} | {name} | {elements} | {warps} | "
                        f"{kernel_us(fn, inputs, 10):.1f} | {diff:.1e} |",
                        flush=True,
                    )
        if not ncu:
            fn = jax.jit(
                functools.partial(window.c51_project, v_min=V_MIN, v_max=V_MAX, impl="xla_scatter")
            )
            print(
                f"| {batch} | {n_atoms} | xla_scatter | - | - | "
                f"{kernel_us(fn, inputs, 10):.1f} | 0 |",
                flush=True,
            )


if __name__ == "__main__":
    main()
