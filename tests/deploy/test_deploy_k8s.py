"""The Kubernetes manifests: `kubectl kustomize` renders base, dev and prod; every object
validates against the Kubernetes schema (kubernetes-validate, strict, pinned version); the
references inside hold (selectors, ConfigMaps, Secrets, ports, probes); the fleet YAML of
each ConfigMap passes `fleetgate check`; the prod engines run exactly what `fleetgate worker`
would run on such a node; the sidecar scripts work against a real gateway."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml
from deploy_tools import (
    DEPLOY,
    K8S_VERSION,
    ROOT,
    fleetgate_check,
    fleetgate_cli,
    kubectl,
    load_script,
    missing,
    run,
)

from fleetgate.catalog.engines import ENGINES
from fleetgate.catalog.gpus import ACCELERATORS
from fleetgate.gateway.registrations import RegistrationBody
from fleetgate.gateway.settings import Settings
from fleetgate.worker.command import build_engine_command
from fleetgate.worker.machine import Machine

K8S = DEPLOY / "k8s"
TARGETS = ["base", "overlays/dev", "overlays/prod"]
SCRIPTS = K8S / "base" / "scripts"
# Secrets an operator creates by hand (the prod overlay's comments say how); dev generates its own.
EXTERNAL_SECRETS = {"overlays/prod": {"fleetgate-keys", "hf-token"}, "base": {"fleetgate-keys"}}
TEST_KEYS = {"FLEETGATE_ADMIN_KEY": "test-admin-key-0123456789",
             "FLEETGATE_API_KEY": "test-api-key-0123456789"}

# The part of the Prometheus Operator's ServiceMonitor CRD the manifests use (the CRD is not
# in the Kubernetes schema); unknown fields are rejected as in strict mode.
SERVICE_MONITOR = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {"type": "object", "additionalProperties": False,
                 "required": ["selector", "endpoints"],
                 "properties": {
                     "selector": {"type": "object",
                                  "properties": {"matchLabels": {"type": "object"}}},
                     "namespaceSelector": {"type": "object"},
                     "endpoints": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "additionalProperties": False, "required": ["port"],
                         "properties": {
                             "port": {"type": "string"}, "path": {"type": "string"},
                             "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                             "authorization": {
                                 "type": "object", "additionalProperties": False,
                                 "properties": {"type": {"type": "string"}, "credentials": {
                                     "type": "object", "additionalProperties": False,
                                     "required": ["name", "key"],
                                     "properties": {"name": {"type": "string"},
                                                    "key": {"type": "string"}}}}},
                             "relabelings": {"type": "array", "items": {
                                 "type": "object", "additionalProperties": False,
                                 "properties": {"sourceLabels": {"type": "array"},
                                                "targetLabel": {"type": "string"},
                                                "action": {"type": "string"},
                                                "regex": {"type": "string"},
                                                "replacement": {"type": "string"}}}}}}}}},
    },
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    tool = kubectl()
    return {t: [d for d in yaml.safe_load_all(run([tool, "kustomize", str(K8S / t)])) if d]
            for t in TARGETS}


def kv() -> Any:
    try:
        import kubernetes_validate
    except ImportError:
        missing("kubernetes-validate", "the dev extra")
    return kubernetes_validate


def of_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def named(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def pod_specs(objs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(o, o["spec"]["template"]) for o in objs
            if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]


def fleet_of(objs: list[dict[str, Any]]) -> str:
    return str(named(objs, "ConfigMap", "fleetgate-fleet")["data"]["fleet.yaml"])


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("target", TARGETS)
def test_every_object_validates_against_the_kubernetes_schema(
        target: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    validator = kv()
    objs = rendered[target]
    assert len(objs) >= 10
    for obj in objs:
        name = f"{target}: {obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] == "ServiceMonitor":
            jsonschema.validate(obj, SERVICE_MONITOR)
            continue
        try:
            validator.validate(obj, K8S_VERSION, strict=True)
        except validator.ValidationError as exc:
            raise AssertionError(f"{name}: {exc.message}") from None


def test_the_validator_rejects_a_broken_object(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The schema check is not a no-op: a misspelt field and a wrong type both fail."""
    validator = kv()
    deployment = named(rendered["overlays/dev"], "Deployment", "fleetgate-gateway")
    typo = yaml.safe_load(yaml.safe_dump(deployment))
    typo["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {}}
    with pytest.raises(validator.ValidationError):
        validator.validate(typo, K8S_VERSION, strict=True)
    wrong = yaml.safe_load(yaml.safe_dump(deployment))
    wrong["spec"]["replicas"] = "two"
    with pytest.raises(validator.ValidationError):
        validator.validate(wrong, K8S_VERSION, strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_references_hold(target: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered[target]
    configmaps = {o["metadata"]["name"]: o for o in of_kind(objs, "ConfigMap")}
    secrets = {o["metadata"]["name"] for o in of_kind(objs, "Secret")}
    secrets |= EXTERNAL_SECRETS.get(target, set())
    pods = pod_specs(objs)
    for workload, template in pods:
        labels = template["metadata"]["labels"]
        assert matches(workload["spec"]["selector"]["matchLabels"], labels)
        spec = template["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for vol in volumes.values():
            if "configMap" in vol:
                cm = configmaps.get(vol["configMap"]["name"])
                assert cm is not None, f"{vol['configMap']['name']} is not rendered"
        for c in spec["containers"]:
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref and not ref.get("optional"):
                    assert ref["name"] in secrets, f"{c['name']}: Secret {ref['name']} unknown"
            for mount in c.get("volumeMounts", []):
                assert "subPath" not in mount, "a subPath mount never sees a ConfigMap update"
                claims = {t["metadata"]["name"] for t in workload["spec"].get(
                    "volumeClaimTemplates", [])}
                assert mount["name"] in volumes or mount["name"] in claims
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if port is not None:
                    assert port in {p["name"] for p in c["ports"]}, f"{c['name']} {probe}"
    for svc in of_kind(objs, "Service"):
        selector = svc["spec"]["selector"]
        backing = [t for _, t in pods if matches(selector, t["metadata"]["labels"])]
        assert backing, f"Service {svc['metadata']['name']} selects no pod"
        names = {p["name"] for t in backing for c in t["spec"]["containers"]
                 for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in names, f"Service {svc['metadata']['name']}: {port}"
    gateway = named(objs, "Deployment", "fleetgate-gateway")
    for kind in ("HorizontalPodAutoscaler", "PodDisruptionBudget"):
        obj = named(objs, kind, "fleetgate-gateway")
        if kind == "HorizontalPodAutoscaler":
            assert obj["spec"]["scaleTargetRef"]["name"] == "fleetgate-gateway"
            assert obj["spec"]["minReplicas"] >= 2
        else:
            assert matches(obj["spec"]["selector"]["matchLabels"],
                           gateway["spec"]["template"]["metadata"]["labels"])
    for sm in of_kind(objs, "ServiceMonitor"):
        for svc in of_kind(objs, "Service"):
            if matches(sm["spec"]["selector"]["matchLabels"], svc["metadata"].get("labels", {})):
                ports = {p["name"] for p in svc["spec"]["ports"]}
                assert all(e["port"] in ports for e in sm["spec"]["endpoints"])
        for e in sm["spec"]["endpoints"]:  # the admin key that /metrics needs with auth on
            cred = e.get("authorization", {}).get("credentials")
            assert cred is None or cred["name"] in secrets, f"Secret {cred} unknown"


@pytest.mark.parametrize("target", TARGETS)
def test_the_gateway_runs_as_the_image_and_the_cli_expect(
        target: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    from fleetgate.gateway.app import create_app

    objs = rendered[target]
    spec = named(objs, "Deployment", "fleetgate-gateway")["spec"]["template"]["spec"]
    gateway = next(c for c in spec["containers"] if c["name"] == "gateway")
    assert "command" not in gateway and "args" not in gateway  # the image's `fleetgate serve`
    env = {e["name"]: e.get("value") for e in gateway["env"]}
    settings_names = {"FLEETGATE_CONFIG"} | {f"FLEETGATE_{n.upper()}"
                                             for n in Settings.model_fields}
    fleet_vars = set(re.findall(r"\$\{(\w+)", fleet_of(objs)))
    for name in env:
        if name.startswith("FLEETGATE_"):
            assert name in settings_names | fleet_vars, f"{name} is read by nothing"
    assert fleet_vars <= set(env), f"the fleet YAML needs {fleet_vars - set(env)}"
    Settings.from_env({k: v for k, v in env.items() if v is not None and k in settings_names})
    config_dir = str(Path(env["FLEETGATE_CONFIG"]).parent)
    mounts = {m["mountPath"]: m["name"] for m in gateway["volumeMounts"]}
    volume = next(v for v in spec["volumes"] if v["name"] == mounts[config_dir])
    assert volume["configMap"]["name"] == "fleetgate-fleet"
    paths = set(create_app(Settings()).openapi()["paths"])
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz" in paths
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz" in paths
    assert gateway["ports"][0]["containerPort"] == int(env["FLEETGATE_PORT"] or 0) == 8080
    assert spec["securityContext"]["runAsUser"] == 10001  # the Dockerfile's USER
    reloader = next(c for c in spec["containers"] if c["name"] == "config-reloader")
    assert reloader["command"][-1] == "/opt/fleetgate-scripts/reload.py"
    names = {e["name"]: e for e in reloader["env"]}
    assert names["FLEETGATE_RELOAD_URL"]["value"].endswith(":8080/admin/reload")
    assert names["FLEETGATE_CONFIG"]["value"] == env["FLEETGATE_CONFIG"]
    scripts = named(objs, "ConfigMap", next(
        v["configMap"]["name"] for v in spec["volumes"] if v["name"] == "scripts"))
    for script in ("reload.py", "register.py"):
        assert scripts["data"][script] == (SCRIPTS / script).read_text()


@pytest.mark.parametrize("target", TARGETS)
def test_the_fleet_configmap_passes_fleetgate_check(
        target: str, rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_of(rendered[target]))
    out = fleetgate_check(path, TEST_KEYS)
    assert "auth: 1 keys" in out


def test_dev_emulators_are_what_the_fleet_dials(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["overlays/dev"]
    fleet = yaml.safe_load(fleet_of(objs))
    services = {s["metadata"]["name"]: s for s in of_kind(objs, "Service")}
    for pool in fleet["pools"]:
        (url,) = pool["endpoints"]
        host, port = re.fullmatch(r"http://([\w-]+):(\d+)", url).groups()  # type: ignore[union-attr]
        assert int(port) in {p["port"] for p in services[host]["spec"]["ports"]}
        deployment = named(objs, "Deployment", host)
        (engine,) = deployment["spec"]["template"]["spec"]["containers"]
        ctx = fleetgate_cli(engine["command"][1:])
        assert engine["command"][0] == "fleetgate"
        assert ctx.params["engine"] == pool["engine"] and ctx.params["gpu"] == pool["accelerator"]
        assert ctx.params["port"] == int(port) and ctx.params["host"] == "0.0.0.0"
        assert set(ctx.params["model"]) == set(pool["models"].values())
        health = ENGINES[pool["engine"]].health_path
        assert engine["readinessProbe"]["httpGet"]["path"] == health


def test_prod_engines_run_what_fleetgate_worker_would(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["overlays/prod"]
    fleet = {p["name"]: p for p in yaml.safe_load(fleet_of(objs))["pools"]}
    namespace = named(objs, "Deployment", "fleetgate-gateway")["metadata"]["namespace"]
    engines = of_kind(objs, "StatefulSet")
    assert {s["metadata"]["name"] for s in engines} == set(fleet)
    runtimes = set()
    for sts in engines:
        name = sts["metadata"]["name"]
        spec = sts["spec"]["template"]["spec"]
        engine = next(c for c in spec["containers"] if c["name"] == "engine")
        register = next(c for c in spec["containers"] if c["name"] == "register")
        env = {e["name"]: e.get("value") for e in register["env"]}
        pool = fleet[name]
        acc, kind = env["ACCELERATOR"], env["ENGINE"]
        vendor, runtime = ACCELERATORS[acc][0], ACCELERATORS[acc][1]
        runtimes.add((runtime, kind))
        tp = int(env["GPUS_PER_REPLICA"])
        port = engine["ports"][0]["containerPort"]
        served = pool["models"]["llama-3.1-70b"]
        model = engine["command"][engine["command"].index(
            "--model-path" if kind == "sglang" else "serve") + 1]
        argv, settings = build_engine_command(kind, model, Machine(runtime, acc, acc, tp),
                                              port=port, python="python3",
                                              served_model_name=served, tensor_parallel=tp)
        assert engine["command"][:len(argv)] == argv, f"{name}: not the worker's command"
        extra = engine["command"][len(argv):]
        for flag in ("--host", "--port", "--served-model-name"):
            assert flag not in extra  # docs/workers.md: the worker owns these
        engine_env = {e["name"]: e.get("value") for e in engine["env"]}
        assert settings.items() <= engine_env.items(), f"{name}: {settings} not all set"
        gpu = "amd.com/gpu" if vendor == "amd" else "nvidia.com/gpu"
        assert engine["resources"]["limits"][gpu] == str(tp)
        assert {"key": gpu, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        assert spec["nodeSelector"]["fleetgate.io/accelerator"] == acc
        health = ENGINES[kind].health_path
        assert engine["startupProbe"]["httpGet"]["path"] == health
        assert env["ENGINE_HEALTH_URL"] == f"http://127.0.0.1:{port}{health}"
        # the registration: a valid body, the same pool the config names, and replica 0's URL
        # is the configured endpoint (re-registering it is a heartbeat, not a second endpoint)
        pod0 = {**env, "ENGINE_URL": env["ENGINE_URL"].replace("$(POD_NAME)", f"{name}-0")
                .replace("$(POD_NAMESPACE)", namespace)}
        body = RegistrationBody.model_validate(load_script(SCRIPTS / "register.py").payload(pod0))
        assert body.url in pool["endpoints"]
        assert (body.pool, body.engine, body.accelerator) == (name, pool["engine"],
                                                              pool["accelerator"])
        assert body.price_per_gpu_hour == pool["price_per_gpu_hour"]
        assert body.gpus_per_replica == pool.get("gpus_per_replica", 1)
        assert body.models == pool["models"]
        assert env["FLEETGATE_PEERS"] == "fleetgate-peers"
        assert named(objs, "Service", sts["spec"]["serviceName"])["spec"]["clusterIP"] == "None"
        fleetgate_cli(["worker", "--engine", kind, "--model", model, "--pool", name,
                       "--accelerator", acc, "--tp", str(tp), "--port", str(port),
                       "--served-model-name", served, "--dry-run", "--", *extra])
    assert runtimes == {("rocm", "vllm"), ("rocm", "sglang"), ("cuda", "vllm"),
                        ("cuda", "sglang")}
    peers = named(objs, "Service", "fleetgate-peers")["spec"]
    assert peers["clusterIP"] == "None" and peers["publishNotReadyAddresses"] is True


def _script(name: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(SCRIPTS / name)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_sidecars_register_and_reload_against_a_real_gateway(tmp_path: Path) -> None:
    """register.py joins a real gateway (and leaves on SIGTERM); reload.py makes it re-read
    its edited config, and reports a bad edit without breaking it."""
    import os

    from procs import PUBLIC_8B, SERVED_8B, pool, spawn_emulator, spawn_gateway, wait_for

    first = spawn_emulator("sglang", "mi300x", [SERVED_8B])
    second = spawn_emulator("vllm", "h100", [SERVED_8B])
    config = {"pools": [pool("mi300x-sglang", "mi300x", "sglang", 1.99, [first.url],
                             {PUBLIC_8B: SERVED_8B})],
              "auth": {"admin_keys": ["${FLEETGATE_ADMIN_KEY}"],
                       "keys": [{"name": "t", "key": "${FLEETGATE_API_KEY}", "tenant": "t"}]}}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(config))
    gw = spawn_gateway(path, tmp_path, env=TEST_KEYS)
    procs: list[subprocess.Popen[str]] = []
    admin = {"Authorization": f"Bearer {TEST_KEYS['FLEETGATE_ADMIN_KEY']}"}

    def pools() -> set[str]:
        rows = httpx.get(f"{gw.url}/admin/endpoints", headers=admin, timeout=5).json()
        return {e["pool"] for e in rows["endpoints"]}

    try:
        port = gw.url.rsplit(":", 1)[1]
        base = {**os.environ, **TEST_KEYS, "FLEETGATE_PEERS": "127.0.0.1",
                "FLEETGATE_PEERS_PORT": port}
        register = _script("register.py", {
            **base, "ENGINE_URL": second.url, "ENGINE_HEALTH_URL": f"{second.url}/health",
            "POOL": "h100-vllm", "ENGINE": "vllm", "ACCELERATOR": "h100",
            "MODELS": f"{PUBLIC_8B}={SERVED_8B}", "PRICE_PER_GPU_HOUR": "2.95", "TTL_S": "3"})
        procs.append(register)
        wait_for(lambda: "h100-vllm" in pools(), timeout=20, what="the registration")
        time.sleep(1.5)  # at least one heartbeat (ttl/3)
        register.send_signal(signal.SIGTERM)
        out, _ = register.communicate(timeout=10)
        assert register.returncode == 0 and "left" in out, out
        assert "h100-vllm" not in pools()

        reloader = _script("reload.py", {**base, "FLEETGATE_CONFIG": str(path),
                                         "FLEETGATE_RELOAD_INTERVAL_S": "0.2",
                                         "FLEETGATE_RELOAD_URL": f"{gw.url}/admin/reload"})
        procs.append(reloader)
        time.sleep(0.5)
        config["pools"].append(pool("h100-vllm", "h100", "vllm", 2.95, [second.url],
                                    {PUBLIC_8B: SERVED_8B}))
        path.write_text(yaml.safe_dump(config))
        wait_for(lambda: "h100-vllm" in pools(), timeout=20, what="the reload")
        path.write_text("pools: []\n")  # invalid: the gateway keeps serving the last good one
        time.sleep(1.0)
        reloader.send_signal(signal.SIGTERM)
        out, _ = reloader.communicate(timeout=10)
        assert "-> 200" in out and "-> 400" in out, out
        assert pools() == {"mi300x-sglang", "h100-vllm"}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        gw.stop()
        first.stop()
        second.stop()


def test_kustomize_renders_without_warnings() -> None:
    """No deprecated kustomization fields (kustomize v5 warns on stderr)."""
    tool = kubectl()
    for target in TARGETS:
        done = subprocess.run([tool, "kustomize", str(K8S / target)], capture_output=True,
                              text=True, cwd=ROOT, timeout=60, check=False)
        assert done.returncode == 0 and not done.stderr.strip(), done.stderr
