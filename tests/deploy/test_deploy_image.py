"""The Dockerfile's build steps without a Docker daemon: the builder stage's COPY set is
enough to build the wheel (built here from exactly those paths), the wheel carries the
shipped configs and the `fleetgate` entry point, the runtime stage's warm-up import works,
and the ENTRYPOINT, EXPOSE, HEALTHCHECK and USER agree with the CLI, the gateway's routes
and the manifests (hadolint lints the file in `make lint`)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from deploy_tools import ROOT, fleetgate_cli


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_builder_stage_builds_the_wheel_from_what_it_copies(tmp_path: Path) -> None:
    steps = instructions()
    builder = steps[:next(i for i, (w, _) in enumerate(steps[1:], 1) if w == "FROM")]
    context = tmp_path / "context"
    context.mkdir()
    for word, rest in builder:
        if word == "COPY":
            *sources, _dest = rest.split()
            for src in sources:
                if (ROOT / src).is_dir():
                    shutil.copytree(ROOT / src, context / src,
                                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
                else:
                    shutil.copy(ROOT / src, context / src)
    (run,) = [rest for word, rest in builder if word == "RUN"]
    assert run.startswith("pip wheel") and run.endswith(" .")
    wheels = tmp_path / "wheels"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--wheel-dir", str(wheels), str(context)],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    (wheel,) = wheels.glob("fleetgate-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert {"fleetgate/config/default.yaml", "fleetgate/config/example.yaml",
                "fleetgate/cli.py"} <= names
        (entry,) = [n for n in names if n.endswith("entry_points.txt")]
        assert "fleetgate = fleetgate.cli:app" in zf.read(entry).decode()


def test_the_runtime_stage_agrees_with_the_cli_and_the_gateway() -> None:
    from fleetgate.gateway.app import create_app
    from fleetgate.gateway.settings import Settings

    steps = instructions()
    runtime = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM"):]
    runs = [rest for word, rest in runtime if word == "RUN"]
    warmup = next(r for r in runs if r.startswith("python -c"))
    code = shlex.split(warmup)[2]
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    entry = json.loads(next(rest for word, rest in runtime if word == "ENTRYPOINT"))
    assert entry[0] == "fleetgate"
    fleetgate_cli(entry[1:])
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(r for w, r in runtime if w == "ENV")))
    expose = int(next(rest for word, rest in runtime if word == "EXPOSE"))
    assert int(env["FLEETGATE_PORT"]) == expose == 8080
    assert env["FLEETGATE_HOST"] == "0.0.0.0"
    health = next(rest for word, rest in runtime if word == "HEALTHCHECK")
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", health)
    assert url is not None and int(url.group(1)) == expose
    assert url.group(2) in create_app(Settings()).openapi()["paths"]
    user = next(rest for word, rest in runtime if word == "USER")
    assert f"--uid {user}" in " ".join(runs) and user == "10001"  # the manifests' runAsUser
