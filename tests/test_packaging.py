"""pyproject.toml: every requirement bounded above, and the installed versions within bounds."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())


def _requirements() -> list[Requirement]:
    project = PYPROJECT["project"]
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    return [
        Requirement(r)
        for r in [*PYPROJECT["build-system"]["requires"], *project["dependencies"], *extras]
    ]


def test_every_requirement_has_an_upper_bound():
    for requirement in _requirements():
        operators = {spec.operator for spec in requirement.specifier}
        assert operators & {"<", "<=", "==", "~="}, f"{requirement} has no upper bound"
        assert not any("*" in spec.version for spec in requirement.specifier), requirement


def test_installed_versions_meet_the_bounds():
    """What CI runs is what pyproject allows (setuptools and the CUDA extra may be absent)."""
    checked = 0
    for requirement in _requirements():
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            assert requirement.name in {"setuptools"} or requirement.extras, requirement
            continue
        assert requirement.specifier.contains(Version(installed), prereleases=True), (
            f"{requirement.name} {installed} is outside {requirement.specifier}"
        )
        checked += 1
    assert checked >= 15


def test_the_cuda_extra_is_jax_s_own_at_the_pinned_version():
    (cuda,) = (Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["cuda"])
    (jax,) = (Requirement(r) for r in PYPROJECT["project"]["dependencies"] if r.startswith("jax="))
    assert cuda.name == "jax" and cuda.extras == {"cuda12"} and cuda.specifier == jax.specifier


def _setup_env(tmp_path: Path, gpu: bool) -> str:
    """scripts/setup_env.sh in a copy of the repository whose .venv python only records what it
    is asked to install, with an nvidia-smi that lists a GPU or none on PATH."""
    root = tmp_path / ("gpu" if gpu else "cpu")
    (root / "scripts").mkdir(parents=True)
    repo = Path(__file__).parent.parent
    shutil.copy(repo / "scripts" / "setup_env.sh", root / "scripts")
    shutil.copy(repo / "pyproject.toml", root)
    fake = root / ".venv" / "bin"
    fake.mkdir(parents=True)
    (fake / "python").write_text(f'#!/bin/sh\necho "$@" >> {root}/installs\n')
    (fake / "nvidia-smi").write_text(
        f"#!/bin/sh\n{'echo GPU 0: NVIDIA H200' if gpu else 'exit 9'}\n"
    )
    for tool in fake.iterdir():
        tool.chmod(0o755)
    path = f"{fake}:{os.environ['PATH']}"
    env = {k: v for k, v in os.environ.items() if k != "JDQN_CPU"} | {"PATH": path}
    subprocess.run(["bash", str(root / "scripts" / "setup_env.sh")], check=True, env=env)
    return (root / "installs").read_text()


def test_setup_installs_the_cuda_extra_where_nvidia_smi_lists_a_gpu(tmp_path):
    assert f"-e {tmp_path / 'gpu'}[dev,cuda]" in _setup_env(tmp_path, gpu=True)
    assert f"-e {tmp_path / 'cpu'}[dev]\n" in _setup_env(tmp_path, gpu=False)
