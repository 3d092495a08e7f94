"""Config loading: env interpolation, YAML-path errors, the shipped configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgate.config import ConfigError, default_config_path, load_config, parse_config

POOL = """
pools:
  - name: h100-vllm
    accelerator: h100
    engine: vllm
    price_per_gpu_hour: "{price}"
    endpoints: ["{endpoint}"]
    models: {{llama: meta-llama/Llama-3.1-8B-Instruct}}
"""


def _pool(price: str = "2.95", endpoint: str = "http://10.0.0.1:8000") -> str:
    return POOL.format(price=price, endpoint=endpoint)


def test_shipped_configs_load() -> None:
    default = load_config(default_config_path())
    assert len(default.pools) == 4 and default.public_models() == ["llama-3.1-8b"]
    assert {p.vendor for p in default.pools} == {"amd", "nvidia"}
    example = load_config(Path(default_config_path()).with_name("example.yaml"))
    assert example.default_policy == "cheapest"


def test_vendor_and_runtime_follow_the_accelerator() -> None:
    cfg = parse_config(_pool(), "t", {})
    assert (cfg.pools[0].vendor, cfg.pools[0].runtime) == ("nvidia", "cuda")
    assert cfg.pools[0].price_per_replica_hour == 2.95


def test_env_interpolation() -> None:
    cfg = parse_config(_pool(price="${PRICE}", endpoint="${HOST:-http://h:1}"), "t",
                       {"PRICE": "1.5"})
    assert cfg.pools[0].price_per_gpu_hour == 1.5
    assert cfg.pools[0].endpoints == ["http://h:1"]


@pytest.mark.parametrize(("text", "expected"), [
    (_pool(price="-1"), "pools[0].price_per_gpu_hour: "),
    (_pool(endpoint="ftp://x"), "pools[0].endpoints: "),
    (_pool(endpoint="emulated://trt/h100"), "emulated engine must be one of"),
    (_pool(endpoint="emulated://vllm/h100?bogus=1"), "unknown options"),
    (_pool(price="${MISSING}"), "pools[0].price_per_gpu_hour: environment variable MISSING"),
    (_pool() + "bogus: 1\n", "bogus: unknown key"),
    (_pool().replace("engine: vllm", "engine: vllm\n    enigne: x"), "pools[0].enigne: unknown"),
    (_pool() + "default_policy: nope\n", "default_policy: 'nope' is not in policies"),
    (_pool() + "routes: [{match: {model: x}, policy: nope}]\n", "routes[0].policy: 'nope'"),
    (_pool() + _pool().replace("pools:\n", ""), "pools: names must be unique"),
    (_pool().replace("engine: vllm", "engine: vllm\n    autoscale: {max_replicas: 0}"),
     "pools[0].autoscale.max_replicas: "),
    (_pool(endpoint='http://h:1", "http://h:2').replace(
        "engine: vllm", "engine: vllm\n    autoscale: {max_replicas: 1}"),
     "pools[0]: 2 endpoints but autoscale.max_replicas is 1"),
    ("pools: [\n", "invalid YAML"),
    ("- 1\n", "(root): must be a mapping"),
])
def test_errors_name_their_yaml_path(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "t.yaml", {})
    assert any(expected in e for e in info.value.errors), info.value.errors


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")
