"""compose.yaml: Debian's docker-compose accepts it (`config -q`, its compose-spec schema);
every fleetgate container runs a command the CLI accepts; every host name, port and mounted
file it points at exists; the gateways' fleet YAML passes `fleetgate check`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_tools import DEPLOY, ROOT, docker_compose, fleetgate_check, fleetgate_cli, run

from fleetgate.catalog.engines import ENGINES

COMPOSE = ROOT / "compose.yaml"
# written by the dashboards work; mounted here, checked only when present
OTHERS = {DEPLOY / "grafana" / "dashboards"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    run([docker_compose(), "-f", str(COMPOSE), "config", "-q"])
    # what docker-compose resolved (anchors merged, ${VAR:-default} filled in)
    return dict(yaml.safe_load(run([docker_compose(), "-f", str(COMPOSE), "config"])))


def mounts_of(svc: dict[str, Any]) -> dict[str, Path]:
    """target -> host source (docker-compose 1.x prints the short form, 2.x the long one)."""
    out = {}
    for vol in svc.get("volumes", []):
        if isinstance(vol, str):
            source, target = vol.split(":")[:2]
        else:
            source, target = vol["source"], vol["target"]
        out[target] = Path(source)
    return out


def test_the_cli_rejects_a_bad_command_line() -> None:
    with pytest.raises(AssertionError):
        fleetgate_cli(["emulate", "--engine", "vllm"])  # no --gpu, no --model
    with pytest.raises(AssertionError):
        fleetgate_cli(["emulate", "--engine", "vllm", "--gpu", "h100", "--model", "m",
                       "--port", "eighty"])


def test_services_and_their_commands(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"lb", "redis", "otel-collector", "jaeger", "prometheus", "grafana",
            "gateway-1", "gateway-2"} <= set(services)
    engines = {n: s for n, s in services.items() if s.get("entrypoint") == ["fleetgate", "emulate"]}
    gpus = set()
    for svc in engines.values():
        ctx = fleetgate_cli(["emulate", *svc["command"]])
        gpus.add(ctx.params["gpu"])
        assert ctx.params["host"] == "0.0.0.0" and str(ctx.params["port"]) in svc["expose"]
        health = ENGINES[ctx.params["engine"]].health_path
        assert f":{ctx.params['port']}{health}'" in " ".join(svc["healthcheck"]["test"])
        assert svc["build"]["context"] == str(ROOT)
    assert gpus == {"mi300x", "mi355x", "h100", "h200"}
    for gw in ("gateway-1", "gateway-2"):
        svc = services[gw]
        assert "entrypoint" not in svc and "command" not in svc  # the image's `fleetgate serve`
        assert svc["image"] == services[next(iter(engines))]["image"]
        assert set(engines) | {"redis"} <= set(svc["depends_on"])


def test_the_gateways_fleet_and_wiring(compose: dict[str, Any], tmp_path: Path) -> None:
    services = compose["services"]
    gw = services["gateway-1"]
    env = gw["environment"]
    fleet_path = mounts_of(gw)[env["FLEETGATE_CONFIG"]]
    out = fleetgate_check(fleet_path, env)
    assert "auth: 1 keys" in out
    fleet = yaml.safe_load(fleet_path.read_text())
    for pool in fleet["pools"]:
        for url in pool["endpoints"]:
            host, port = re.fullmatch(r"http://([\w-]+):(\d+)", url).groups()  # type: ignore[union-attr]
            assert port in services[host]["expose"], url
            assert ["--engine", pool["engine"], "--gpu", pool["accelerator"]] == \
                services[host]["command"][:4]
    assert env["FLEETGATE_REDIS_URL"].startswith("redis://redis:6379")
    assert re.fullmatch(r"http://otel-collector:4318", env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    collector = yaml.safe_load((DEPLOY / "otel" / "collector.yaml").read_text())
    assert collector["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger:4317"
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    nginx = (DEPLOY / "nginx" / "nginx.conf").read_text()
    assert set(re.findall(r"server (gateway-\d):8080", nginx)) == {"gateway-1", "gateway-2"}
    assert "proxy_buffering off" in nginx  # SSE streams pass through as they come


def test_prometheus_grafana_and_every_mount(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, svc in services.items():
        for source in mounts_of(svc).values():
            assert source.exists() or source in OTHERS, f"{name}: {source} is missing"
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"]
               for t in sc["targets"]}
    for target in targets:
        host, port = target.split(":")
        svc = services[host]
        assert port in svc.get("expose", []) or svc.get("entrypoint") is None, target
    engines = {n for n, s in services.items() if s.get("entrypoint") == ["fleetgate", "emulate"]}
    assert {t.split(":")[0] for t in targets} == engines | {"gateway-1", "gateway-2"}
    assert prom["rule_files"] == ["/etc/prometheus/alerts*.yaml"]
    alerts = DEPLOY / "prometheus" / "alerts.yaml"
    if alerts.exists():
        assert yaml.safe_load(alerts.read_text())["groups"]
    grafana = services["grafana"]
    mounts = mounts_of(grafana)
    provisioning = DEPLOY / "grafana" / "provisioning"
    provider = yaml.safe_load((provisioning / "dashboards" / "fleetgate.yaml").read_text())
    (path,) = [p["options"]["path"] for p in provider["providers"]]
    assert mounts[path] == DEPLOY / "grafana" / "dashboards"
    assert mounts["/etc/grafana/provisioning"] == DEPLOY / "grafana" / "provisioning"
    sources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/datasources.yaml")
                             .read_text())["datasources"]
    for ds in sources:
        host = re.match(r"http://([\w-]+):", ds["url"]).group(1)  # type: ignore[union-attr]
        assert host in services
    for dashboard in (DEPLOY / "grafana" / "dashboards").glob("*.json"):
        assert json.loads(dashboard.read_text())["panels"]
