"""Engine-pool autoscaling on Kubernetes (deploy/k8s/components/keda and .../hpa, the
overlays dev-keda, dev-hpa, prod-keda, prod-hpa), offline: every ScaledObject validates
against KEDA's CRD schema kept in tests/deploy/schemas/ (KEDA 2.20.2), every HPA and every
other object against the Kubernetes schema (kubernetes-validate, strict); each autoscaler
scales a workload of the render on the gateway's fleetgate_pool_desired_replicas gauge of
a pool of the rendered fleet ConfigMap, within that pool's `autoscale:` bounds, with
replicas = the gauge; the prometheus-adapter rule serves what the HPAs ask for; the engines
drain before they stop (the preStop script is run against a fake engine)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from deploy_tools import DEPLOY, K8S_VERSION, kubectl, load_script, run

K8S = DEPLOY / "k8s"
SCHEMAS = Path(__file__).parent / "schemas"
KEDA = {"overlays/dev-keda": "Deployment", "overlays/prod-keda": "StatefulSet"}
HPA = {"overlays/dev-hpa": "Deployment", "overlays/prod-hpa": "StatefulSet"}
TARGETS = {**KEDA, **HPA}
PLAIN = ["overlays/dev", "overlays/prod"]
GAUGE = "fleetgate_pool_desired_replicas"
ADAPTER = K8S / "components" / "hpa" / "prometheus-adapter-values.yaml"
DRAIN = K8S / "base" / "scripts" / "drain.py"


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    tool = kubectl()
    return {t: [d for d in yaml.safe_load_all(run([tool, "kustomize", str(K8S / t)])) if d]
            for t in [*TARGETS, *PLAIN]}


def keda_schema() -> dict[str, Any]:
    return dict(json.loads((SCHEMAS / "keda-scaledobject.json").read_text()))


def of_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def engine_autoscalers(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")
            and o["metadata"]["name"] != "fleetgate-gateway"]


def fleet_pools(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (cm,) = [o for o in of_kind(objs, "ConfigMap") if o["metadata"]["name"] == "fleetgate-fleet"]
    return {p["name"]: p for p in yaml.safe_load(cm["data"]["fleet.yaml"])["pools"]}


def scaledobject_problems(obj: dict[str, Any], objs: list[dict[str, Any]]) -> list[str]:
    """What is wrong with a ScaledObject in the render `objs` (empty: nothing)."""
    validator = jsonschema.Draft7Validator(keda_schema())
    problems = [f"schema: {'/'.join(map(str, e.absolute_path))}: {e.message}"
                for e in validator.iter_errors(obj)]
    if problems:
        return problems
    spec = obj["spec"]
    lo, hi = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
    if lo > hi:  # the CRD's one CEL rule (x-kubernetes-validations)
        problems.append("minReplicaCount must be less than or equal to maxReplicaCount")
    (trigger,) = spec["triggers"]
    if trigger["type"] != "prometheus":
        return [*problems, f"trigger {trigger['type']}, not prometheus"]
    if trigger.get("metricType") != "AverageValue" or trigger["metadata"].get("threshold") != "1":
        problems.append("replicas = the gauge needs metricType AverageValue and threshold '1'")
    if trigger["metadata"].get("ignoreNullValues") != "false":
        problems.append("ignoreNullValues must be 'false' (no sample would shrink to the floor)")
    query = trigger["metadata"].get("query", "")
    pools = set(re.findall(GAUGE + r'\{[^}]*pool="([^"]+)"', query))
    if len(pools) != 1:
        return [*problems, f"query {query!r} names no single pool of {GAUGE}"]
    problems += bounds_problems(pools.pop(), lo, hi, spec["scaleTargetRef"], objs)
    return problems


def hpa_problems(obj: dict[str, Any], objs: list[dict[str, Any]]) -> list[str]:
    """What is wrong with an engine pool's HPA in the render `objs` beyond its schema."""
    spec = obj["spec"]
    (metric,) = spec["metrics"]
    if metric["type"] != "External" or metric["external"]["metric"]["name"] != GAUGE:
        return [f"not the External metric {GAUGE}"]
    if metric["external"]["target"] != {"type": "AverageValue", "averageValue": "1"}:
        return ["replicas = the gauge needs target AverageValue '1'"]
    pool = metric["external"]["metric"].get("selector", {}).get("matchLabels", {}).get("pool")
    if pool is None:
        return ["the metric selects no pool (the HPA would sum every pool's gauge)"]
    return bounds_problems(pool, spec.get("minReplicas", 1), spec["maxReplicas"],
                           spec["scaleTargetRef"], objs)


def bounds_problems(pool: str, lo: int, hi: int, ref: dict[str, Any],
                    objs: list[dict[str, Any]]) -> list[str]:
    pools = fleet_pools(objs)
    if pool not in pools:
        return [f"pool {pool!r} is not in the fleet ConfigMap ({sorted(pools)})"]
    auto = pools[pool].get("autoscale")
    problems = []
    if auto is None:
        problems.append(f"pool {pool!r} has no autoscale: (the gateway publishes no gauge)")
    elif (lo, hi) != (auto.get("min_replicas", 1), auto["max_replicas"]):
        problems.append(f"{pool}: replicas {lo}..{hi}, autoscale: says "
                        f"{auto.get('min_replicas', 1)}..{auto['max_replicas']}")
    if lo < 1:
        problems.append(f"{pool}: a floor of 0 removes the fleet YAML's replica 0")
    if hi > 10:  # the HPA's 10% tolerance swallows one-replica steps above 10
        problems.append(f"{pool}: ceiling {hi} > 10")
    kind = ref.get("kind", "Deployment")
    targets = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == ref["name"]]
    if ref.get("apiVersion", "apps/v1") != "apps/v1" or len(targets) != 1:
        problems.append(f"scaleTargetRef {ref} is not a workload of the render")
    elif ref["name"] != pool:
        problems.append(f"scaleTargetRef {ref['name']} scales another pool than {pool}")
    elif "replicas" in targets[0]["spec"]:
        problems.append(f"{kind}/{ref['name']} sets replicas: every apply would reset it")
    return problems


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_object_validates(target: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    """ScaledObjects against KEDA's CRD; everything else (HPAs included) against the
    Kubernetes schema in strict mode, as test_deploy_k8s.py does for the plain overlays."""
    import kubernetes_validate

    schema = keda_schema()
    objs = rendered[target]
    namespaces = {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"}
    assert len(namespaces) == 1 and None not in namespaces, f"{target}: {namespaces}"
    for obj in objs:
        name = f"{target}: {obj['kind']}/{obj['metadata']['name']}"
        assert obj["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") == "fleetgate"
        if obj["kind"] == "ServiceMonitor":
            continue  # test_deploy_k8s.py checks them in the plain overlays
        if obj["kind"] == "ScaledObject":
            try:
                jsonschema.validate(obj, schema)
            except jsonschema.ValidationError as exc:
                raise AssertionError(f"{name}: {exc.message}") from None
            continue
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{name}: {exc.message}") from None


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_each_pool_is_scaled_on_its_gauge_within_its_bounds(
        target: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered[target]
    kind = "ScaledObject" if target in KEDA else "HorizontalPodAutoscaler"
    scalers = engine_autoscalers(objs)
    assert {o["kind"] for o in scalers} == {kind}, "KEDA and the HPA on one workload fight"
    check = scaledobject_problems if kind == "ScaledObject" else hpa_problems
    for obj in scalers:
        assert check(obj, objs) == [], f"{target}: {obj['metadata']['name']}"
    engines = [o for o in objs if o["kind"] == TARGETS[target]
               and o["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"]
    assert {o["metadata"]["name"] for o in engines} == set(fleet_pools(objs))
    refs = sorted(o["spec"]["scaleTargetRef"]["name"] for o in scalers)
    assert refs == sorted(o["metadata"]["name"] for o in engines), "one autoscaler per pool"
    for sobj in scalers:  # no second hysteresis on top of the gateway's (DESIGN.md §1)
        spec = sobj["spec"]
        behavior = (spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
                    if kind == "ScaledObject" else spec["behavior"])
        assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
        assert 0 < behavior["scaleDown"]["stabilizationWindowSeconds"] <= 60


@pytest.mark.parametrize("target", PLAIN)
def test_plain_overlays_have_no_engine_autoscaler(
        target: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    """dev and prod keep a fixed replica count; autoscaling is a choice (a component)."""
    assert engine_autoscalers(rendered[target]) == []
    assert all(p.get("autoscale") for p in fleet_pools(rendered[target]).values())


def test_a_broken_scaledobject_or_hpa_is_caught(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Each check above is not a no-op: a deliberately wrong copy of a good object fails."""
    objs = rendered["overlays/prod-keda"]
    good = engine_autoscalers(objs)[0]
    assert scaledobject_problems(good, objs) == []

    def broken(edit: Any) -> list[str]:
        obj = json.loads(json.dumps(good))
        edit(obj["spec"])
        return scaledobject_problems(obj, objs)

    def set_(path: str, value: Any) -> Any:
        def edit(spec: dict[str, Any]) -> None:
            *parents, leaf = path.split(".")
            node = spec
            for p in parents:
                node = node[int(p)] if isinstance(node, list) else node[p]
            node[int(leaf) if isinstance(node, list) else leaf] = value
        return edit

    cases = {
        "schema": set_("minReplicaCount", "1"),                      # a string, not an integer
        "schema ": set_("maxReplicaCount", 0),                       # minimum 1
        "schema  ": set_("triggers.0.metadata.threshold", 1),        # metadata values are strings
        "schema   ": set_("triggers.0.authenticationRef", {"kind": "Secret", "name": "x"}),
        "schema    ": set_("pollingIntervall", 15),                  # unknown field
        "CEL": set_("minReplicaCount", 5),                           # > maxReplicaCount (4)
        "metricType": set_("triggers.0.metricType", "Value"),
        "pool": set_("triggers.0.metadata.query",
                     'max(fleetgate_pool_desired_replicas{pool="b200-vllm"})'),
        "bounds": set_("maxReplicaCount", 3),
        "target": set_("scaleTargetRef.kind", "Deployment"),         # prod's are StatefulSets
        "target ": set_("scaleTargetRef.name", "h200-sglang"),       # another pool's
    }
    for what, edit in cases.items():
        assert broken(edit), f"a broken {what.strip()} passes"
    # a target that still sets replicas
    with_replicas = [json.loads(json.dumps(o)) for o in objs]
    for o in with_replicas:
        if o["kind"] == "StatefulSet":
            o["spec"]["replicas"] = 1
    assert any("replicas" in p for p in scaledobject_problems(good, with_replicas))
    # HPAs: the Kubernetes schema and the pool checks
    import kubernetes_validate

    hobjs = rendered["overlays/prod-hpa"]
    hpa = engine_autoscalers(hobjs)[0]
    assert hpa_problems(hpa, hobjs) == []
    wrong = json.loads(json.dumps(hpa))
    wrong["spec"]["metrics"][0]["external"]["target"] = {"type": "AverageValue", "averageValu": "1"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, K8S_VERSION, strict=True)
    assert hpa_problems(wrong, hobjs)
    scaled_by_value = json.loads(json.dumps(hpa))
    scaled_by_value["spec"]["metrics"][0]["external"]["target"] = {"type": "Value", "value": "1"}
    kubernetes_validate.validate(scaled_by_value, K8S_VERSION, strict=True)  # valid, but wrong:
    assert hpa_problems(scaled_by_value, hobjs)
    unselected = json.loads(json.dumps(hpa))
    del unselected["spec"]["metrics"][0]["external"]["metric"]["selector"]
    assert hpa_problems(unselected, hobjs)
    wrong_max = json.loads(json.dumps(hpa))
    wrong_max["spec"]["maxReplicas"] = 7
    assert hpa_problems(wrong_max, hobjs)


def test_the_scaledobject_schema_follows_kedas_crd() -> None:
    schema = keda_schema()
    assert "v2.20.2" in schema["$id"] and "keda.sh_scaledobjects.yaml" in schema["$comment"]
    jsonschema.Draft7Validator.check_schema(schema)
    spec = schema["properties"]["spec"]
    assert spec["required"] == ["scaleTargetRef", "triggers"]
    trigger = spec["properties"]["triggers"]["items"]
    assert trigger["required"] == ["metadata", "type"] and trigger["additionalProperties"] is False
    assert trigger["properties"]["metadata"]["additionalProperties"] == {"type": "string"}


def test_prometheus_adapter_serves_what_the_hpas_ask_for(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    values = yaml.safe_load(ADAPTER.read_text())
    (rule,) = values["rules"]["external"]
    assert GAUGE in rule["seriesQuery"] and 'pool!=""' in rule["seriesQuery"]
    assert rule["name"]["as"] == GAUGE and re.fullmatch(rule["name"]["matches"], GAUGE)
    assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}
    # one series per pool (the HPA sums what it gets), the selector's labels applied
    assert re.fullmatch(r"max\(<<\.Series>>\{<<\.LabelMatchers>>\}\) by \(pool\)",
                        rule["metricsQuery"])
    for target in HPA:
        for hpa in engine_autoscalers(rendered[target]):
            metric = hpa["spec"]["metrics"][0]["external"]["metric"]
            assert metric["name"] == rule["name"]["as"]
            assert set(metric["selector"]["matchLabels"]) == {"pool"}


@pytest.mark.parametrize("target", PLAIN)
def test_engines_drain_before_they_stop(target: str,
                                        rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Each engine container's preStop runs drain.py on its own /metrics, within the grace
    period; in prod the register sidecar (which DELETEs the endpoint on SIGTERM) has none."""
    objs = rendered[target]
    scripts = [o for o in of_kind(objs, "ConfigMap")
               if o["metadata"]["name"].startswith("fleetgate-scripts")]
    (cm,) = scripts
    assert cm["data"]["drain.py"] == DRAIN.read_text()
    for workload in objs:
        if workload["kind"] not in ("Deployment", "StatefulSet") or \
                workload["metadata"]["labels"].get("app.kubernetes.io/component") != "engine":
            continue
        spec = workload["spec"]["template"]["spec"]
        engine = next(c for c in spec["containers"] if c["name"] == "engine")
        argv = engine["lifecycle"]["preStop"]["exec"]["command"]
        assert argv[0] in ("python", "python3") and argv[1].endswith("/drain.py")
        port = engine["ports"][0]["containerPort"]
        assert argv[2] == f"http://127.0.0.1:{port}/metrics"
        assert float(argv[3]) + 30 <= spec["terminationGracePeriodSeconds"]
        mounts = {m["mountPath"]: m["name"] for m in engine["volumeMounts"]}
        assert mounts["/opt/fleetgate-scripts"] in {v["name"] for v in spec["volumes"]
                                                    if v.get("configMap", {}).get("name")
                                                    == cm["metadata"]["name"]}
        for c in spec["containers"]:
            if c["name"] == "register":
                assert "lifecycle" not in c  # it leaves at once, while the engine drains


def test_drain_parses_both_engines_metrics() -> None:
    drain = load_script(DRAIN)
    vllm = ('# HELP vllm:num_requests_running x\nvllm:num_requests_running{model_name="m"} 2.0\n'
            'vllm:num_requests_waiting{model_name="m"} 1.0\nvllm:num_requests_running_x 9\n')
    assert drain.in_flight(vllm) == 3.0
    assert drain.in_flight("sglang:num_running_reqs{a=\"b\"} 0.0\nsglang:num_queue_reqs 0\n") == 0
    assert drain.in_flight("other 1\n") is None


class _Engine(BaseHTTPRequestHandler):
    running = 1

    def do_GET(self) -> None:
        body = f"vllm:num_requests_running{{model_name=\"m\"}} {type(self).running}.0\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def fake_engine() -> Iterator[tuple[str, type[_Engine]]]:
    handler = type("Engine", (_Engine,), {"running": 1})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", handler
    finally:
        server.shutdown()


def test_drain_waits_for_the_last_request(fake_engine: tuple[str, type[_Engine]]) -> None:
    """The preStop as Kubernetes runs it: it returns only after the engine went idle."""
    url, engine = fake_engine
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(DRAIN), url, "30", "0"], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(2.0)
    assert proc.poll() is None, "returned with a request in flight"
    engine.running = 0
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0 and "idle" in out, out
    assert time.monotonic() - start >= 2.0


def test_drain_gives_up_at_its_limit_and_on_a_dead_engine(
        fake_engine: tuple[str, type[_Engine]]) -> None:
    url, _ = fake_engine  # running stays 1
    out = run([sys.executable, str(DRAIN), url, "1.5", "0"], timeout=20)
    assert "gave up" in out
    out = run([sys.executable, str(DRAIN), "http://127.0.0.1:9/metrics", "30"], timeout=20)
    assert "nothing to wait for" in out
