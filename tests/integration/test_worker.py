"""``fleetgate.worker``: machine detection with faked tools, the engine command per engine and
runtime, and the worker's whole life (start, health wait, register, heartbeat, lapse,
signals, deregister) against a stand-in engine: a fake ``vllm`` package whose
``vllm.entrypoints.openai.api_server`` execs the emulator, behind a real ``fleetgate serve``.

The real vLLM runs in ``tests/engines`` (``make test-engines``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetgate.worker import (
    Machine,
    accelerator_of,
    build_engine_command,
    detect_machine,
    exit_status,
    render_command,
    run_worker,
    tensor_parallel_of,
)
from procs import Proc, free_port, pool, spawn_gateway

# -- machine detection -----------------------------------------------------------------------
AMD_SMI_JSON = json.dumps([
    {"gpu": i, "asic": {"market_name": "AMD Instinct MI300X", "target_graphics_version": "gfx942"}}
    for i in range(8)])
ROCM_SMI_JSON = json.dumps({f"card{i}": {"Card Series": "AMD Instinct MI325X OAM",
                                         "GFX Version": "gfx942"} for i in range(2)})
ROCM_SMI_TEXT = """
============================ ROCm System Management Interface ============================
GPU[0]		: Card Series: 		AMD Instinct MI355X
GPU[0]		: GFX Version: 		gfx950
==========================================================================================
"""


def fake_machine(tools: dict[tuple[str, ...], str | None], paths: tuple[str, ...] = ()
                 ) -> tuple[Callable[[list[str]], str | None], Callable[[str], bool],
                            Callable[[str], str | None]]:
    """(run, exists, which) for detect_machine: ``tools`` maps argv to stdout (None: fails)."""
    names = {argv[0] for argv in tools}

    def run(argv: list[str]) -> str | None:
        return tools.get(tuple(argv))

    return run, paths.__contains__, lambda name: f"/usr/bin/{name}" if name in names else None


NVSMI = ("nvidia-smi", "--query-gpu=name", "--format=csv,noheader")
DETECTION = [
    ("amd-smi json", {("amd-smi", "static", "--asic", "--json"): AMD_SMI_JSON}, (),
     Machine("rocm", "mi300x", "AMD Instinct MI300X", 8)),
    ("rocm-smi json", {("rocm-smi", "--showproductname", "--json"): ROCM_SMI_JSON}, (),
     Machine("rocm", "mi325x", "AMD Instinct MI325X OAM", 2)),
    ("rocm-smi text", {("rocm-smi", "--showproductname", "--json"): None,
                       ("rocm-smi", "--showproductname"): ROCM_SMI_TEXT}, (),
     Machine("rocm", "mi355x", "AMD Instinct MI355X", 1)),
    ("amd-smi fails, rocm-smi answers",
     {("amd-smi", "static", "--asic", "--json"): None,
      ("rocm-smi", "--showproductname", "--json"): ROCM_SMI_JSON}, (),
     Machine("rocm", "mi325x", "AMD Instinct MI325X OAM", 2)),
    ("/dev/kfd without tools", {}, ("/dev/kfd",), Machine("rocm", None, "unknown AMD GPU", 0)),
    ("nvidia h100", {NVSMI: "NVIDIA H100 80GB HBM3\nNVIDIA H100 80GB HBM3\n"}, (),
     Machine("cuda", "h100", "NVIDIA H100 80GB HBM3", 2)),
    ("nvidia h200", {NVSMI: "NVIDIA H200\n"}, (), Machine("cuda", "h200", "NVIDIA H200", 1)),
    ("nvidia b200", {NVSMI: "NVIDIA B200\n"}, (), Machine("cuda", "b200", "NVIDIA B200", 1)),
    ("nvidia not in the catalog", {NVSMI: "NVIDIA A100-SXM4-80GB\n"}, (),
     Machine("cuda", None, "NVIDIA A100-SXM4-80GB", 1)),
    ("nvidia-smi without a driver", {NVSMI: None}, (), Machine("cpu", "cpu", "cpu", 0)),
    ("nothing", {}, (), Machine("cpu", "cpu", "cpu", 0)),
]


@pytest.mark.parametrize(("tools", "paths", "want"), [d[1:] for d in DETECTION],
                         ids=[d[0] for d in DETECTION])
def test_detect_machine(tools: dict[tuple[str, ...], str | None], paths: tuple[str, ...],
                        want: Machine) -> None:
    run, exists, which = fake_machine(tools, paths)
    assert detect_machine(run, exists, which) == want


@pytest.mark.parametrize(("name", "acc"), [
    ("AMD Instinct MI300X OAM", "mi300x"), ("AMD Instinct MI300X VF", "mi300x"),
    ("AMD Instinct MI325X", "mi325x"), ("AMD Instinct MI355X", "mi355x"),
    ("NVIDIA H100 PCIe", "h100"), ("NVIDIA H100 NVL", "h100"), ("NVIDIA H200 NVL", "h200"),
    ("NVIDIA B200", "b200"), ("AMD Instinct MI250X/MI250", None), ("Tesla T4", None)])
def test_accelerator_of(name: str, acc: str | None) -> None:
    assert accelerator_of(name) == acc


# -- the engine command ----------------------------------------------------------------------
ROCM = Machine("rocm", "mi300x", "AMD Instinct MI300X", 8)
CUDA = Machine("cuda", "h100", "NVIDIA H100 80GB HBM3", 8)
CPU = Machine("cpu", "cpu", "cpu", 0)
PY = "/opt/engine/bin/python"

COMMANDS = [
    ("vllm rocm", "vllm", ROCM,
     [PY, "-m", "vllm.entrypoints.cli.main", "serve", "M", "--host", "0.0.0.0", "--port", "8000",
      "--served-model-name", "M"],
     {"VLLM_ROCM_USE_AITER": "1", "HIP_FORCE_DEV_KERNARG": "1", "SAFETENSORS_FAST_GPU": "1",
      "TOKENIZERS_PARALLELISM": "false", "HSA_ENABLE_IPC_MODE_LEGACY": "1",
      "VLLM_NO_USAGE_STATS": "1"}),
    ("vllm cuda", "vllm", CUDA,
     [PY, "-m", "vllm.entrypoints.cli.main", "serve", "M", "--host", "0.0.0.0", "--port", "8000",
      "--served-model-name", "M"],
     {"VLLM_NO_USAGE_STATS": "1"}),
    ("vllm cpu", "vllm", CPU,
     [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", "M", "--host", "0.0.0.0",
      "--port", "8000", "--served-model-name", "M"],
     {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
      "VLLM_NO_USAGE_STATS": "1"}),
    ("sglang rocm", "sglang", ROCM,
     [PY, "-m", "sglang.launch_server", "--model-path", "M", "--host", "0.0.0.0", "--port",
      "8000", "--served-model-name", "M", "--enable-metrics"],
     {"SGLANG_USE_AITER": "1", "SGLANG_ROCM_FUSED_DECODE_MLA": "1", "HIP_FORCE_DEV_KERNARG": "1",
      "HSA_NO_SCRATCH_RECLAIM": "1", "NCCL_MIN_NCHANNELS": "112"}),
    ("sglang cuda", "sglang", CUDA,
     [PY, "-m", "sglang.launch_server", "--model-path", "M", "--host", "0.0.0.0", "--port",
      "8000", "--served-model-name", "M", "--enable-metrics"], {}),
    ("sglang cpu", "sglang", CPU,
     [PY, "-m", "sglang.launch_server", "--model-path", "M", "--host", "0.0.0.0", "--port",
      "8000", "--served-model-name", "M", "--enable-metrics", "--device", "cpu"],
     {"SGLANG_USE_CPU_ENGINE": "1"}),
]


@pytest.mark.parametrize(("engine", "machine", "argv", "env"), [c[1:] for c in COMMANDS],
                         ids=[c[0] for c in COMMANDS])
def test_engine_command_per_runtime(engine: str, machine: Machine, argv: list[str],
                                    env: dict[str, str]) -> None:
    assert build_engine_command(engine, "M", machine, port=8000, python=PY) == (argv, env)


def test_no_aiter_off_amd() -> None:
    for machine in (CUDA, CPU):
        for engine in ("vllm", "sglang"):
            _, env = build_engine_command(engine, "M", machine, port=1, python=PY)
            assert not any("AITER" in k or k.startswith(("HIP_", "HSA_")) for k in env)


def test_operator_environment_wins_and_env_overrides_win_over_all() -> None:
    _, env = build_engine_command(
        "vllm", "M", ROCM, port=1, environ={"VLLM_ROCM_USE_AITER": "0", "PATH": "/bin"},
        env_overrides={"HIP_FORCE_DEV_KERNARG": "0", "EXTRA": "x"})
    assert "VLLM_ROCM_USE_AITER" not in env  # the child inherits the operator's 0
    assert env["HIP_FORCE_DEV_KERNARG"] == "0" and env["EXTRA"] == "x"
    assert "PATH" not in env


def test_served_name_tp_extra_args_and_local_model() -> None:
    argv, env = build_engine_command(
        "vllm", "/models/llama", CUDA, port=9000, host="10.0.0.5", python=PY,
        served_model_name="llama-3.1-8b", tensor_parallel=4, model_is_local=True,
        extra_args=["--max-model-len", "8192"])
    assert argv[argv.index("--served-model-name") + 1] == "llama-3.1-8b"
    assert argv[argv.index("--host") + 1] == "10.0.0.5" and "9000" in argv
    assert argv[-4:] == ["--tensor-parallel-size", "4", "--max-model-len", "8192"]
    assert env["HF_HUB_OFFLINE"] == "1"
    sg, _ = build_engine_command("sglang", "M", ROCM, port=1, python=PY, tensor_parallel=8)
    assert sg[sg.index("--tp-size") + 1] == "8"


def test_unknown_engine_is_refused() -> None:
    with pytest.raises(ValueError, match="engine must be one of"):
        build_engine_command("tgi", "M", CPU, port=1)


def test_render_command_round_trips_through_a_shell() -> None:
    argv, env = build_engine_command("vllm", "/path with space/m", CPU, port=1, python=PY,
                                     extra_args=["--chat-template", "{{ x }}"])
    words = shlex.split(render_command(argv, env))
    assert words[:len(env)] == [f"{k}={v}" for k, v in sorted(env.items())]
    assert words[len(env):] == argv


@pytest.mark.parametrize(("args", "want"), [
    ([], 1), (["--tensor-parallel-size", "4"], 4), (["-tp", "2"], 2), (["--tp-size=8"], 8),
    (["--tp", "x"], 1), (["--tensor-parallel-size"], 1)])
def test_tensor_parallel_of(args: list[str], want: int) -> None:
    assert tensor_parallel_of(args, 1) == want


@pytest.mark.parametrize(("code", "want"), [(0, 1), (1, 1), (3, 3), (-9, 137), (-15, 143)])
def test_exit_status(code: int, want: int) -> None:
    assert exit_status(code) == want


def test_dry_run_prints_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_worker("vllm", "M", "p", None, 8123, ["--dtype", "float32"], dry_run=True,
                      machine=ROCM, python=PY)
    out = capsys.readouterr().out
    assert code == 0
    assert f"VLLM_ROCM_USE_AITER=1 {PY} -m vllm.entrypoints.cli.main serve M" in out
    assert out.rstrip().endswith("--port 8123 --served-model-name M --dtype float32")


def test_refusals_before_starting_anything(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_worker("tgi", "M", "p", None, 1, []) == 2
    assert run_worker("vllm", "M", "p", "http://gw", 1, [], machine=CPU) == 2
    assert "--price-per-gpu-hour is required" in capsys.readouterr().out
    unknown = Machine("cuda", None, "NVIDIA A100", 1)
    assert run_worker("vllm", "M", "p", "http://gw", 1, [], machine=unknown,
                      price_per_gpu_hour=1.0) == 2
    assert "pass --accelerator" in capsys.readouterr().out


# -- the whole life, against a stand-in engine -----------------------------------------------
STAND_IN = '''
"""Stand-in for vllm.entrypoints.openai.api_server: records its environment, execs the
fleetgate emulator (vLLM flavour) with the served name, host and port it was given."""
import argparse, json, os, sys
p = argparse.ArgumentParser()
for flag in ("--model", "--host", "--port", "--served-model-name"):
    p.add_argument(flag)
args, _ = p.parse_known_args()
with open(os.environ["STAND_IN_RECORD"], "w") as f:
    json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, f)
os.execv(sys.executable, [sys.executable, "-m", "fleetgate.emulator", "--engine",
         "vllm", "--gpu", "h100", "--model", args.served_model_name, "--host", args.host,
         "--port", args.port, "--speed", "50"])
'''


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    pkg = tmp_path / "fakevllm" / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(STAND_IN)
    return tmp_path / "fakevllm"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """One gateway for the process tests: each worker registers its own URL and leaves."""
    config = {"pools": [pool("h100-emu", "h100", "vllm", 2.95, ["emulated://vllm/h100?speed=50"],
                             {"other": "other-model"})]}
    proc = spawn_gateway(config, tmp_path_factory.mktemp("gw"))
    yield proc
    proc.stop()


class WorkerProc:
    """``run_worker`` in a child process (signals need a main thread of their own)."""

    def __init__(self, stand_in: Path, gateway: str, tmp: Path, ttl_s: float = 15.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.record = tmp / "stand-in.json"
        self.log = tmp / "worker.log"
        call = (f"run_worker('vllm', 'tiny-standin', 'cpu-standin', {gateway!r}, {self.port}, "
                f"['--dtype', 'float32'], host='127.0.0.1', machine=Machine('cpu', 'cpu', "
                f"'cpu', 0), public_names=['standin'], price_per_gpu_hour=0.05, ttl_s={ttl_s}, "
                f"start_timeout_s=60, stop_timeout_s=10)")
        code = f"import sys; from fleetgate.worker import *; sys.exit({call})"
        env = {**os.environ, "PYTHONPATH": f"{stand_in}{os.pathsep}"
               f"{os.environ.get('PYTHONPATH', '')}", "STAND_IN_RECORD": str(self.record)}
        with self.log.open("wb") as out:
            self.popen = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=out,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def lines(self) -> list[str]:
        return re.findall(r"fleetgate worker: [^\n]*", self.log.read_text(errors="replace"))

    def engine_pid(self) -> int:
        line = next(ln for ln in self.lines() if "engine pid=" in ln)
        return int(line.split("engine pid=")[1].split()[0])

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        finally:
            if self.popen.poll() is None:
                self.popen.kill()


def poll(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not met within {timeout}s")


def registered(gateway: Proc, url: str) -> dict[str, Any] | None:
    rows = httpx.get(gateway.url + "/admin/endpoints", timeout=5).json()["endpoints"]
    return next((r for r in rows if r["url"] == url), None)


def models(gateway: Proc) -> list[str]:
    return [m["id"] for m in httpx.get(gateway.url + "/v1/models", timeout=5).json()["data"]]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(90)
def test_register_serve_and_deregister_on_sigterm(stand_in: Path, gateway: Proc,
                                                  tmp_path: Path) -> None:
    worker = WorkerProc(stand_in, gateway.url, tmp_path)
    try:
        row = poll(lambda: registered(gateway, worker.url), what="registration")
        assert row["pool"] == "cpu-standin" and row["accelerator"] == "cpu"
        assert row["models"] == {"standin": "tiny-standin"} and row["engine"] == "vllm"
        assert "standin" in models(gateway)
        poll(lambda: (registered(gateway, worker.url) or {}).get("health") == "ready",
             what="health")
        resp = httpx.post(gateway.url + "/v1/chat/completions", timeout=10, json={
            "model": "standin", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
        assert resp.status_code == 200 and resp.headers["x-fleetgate-pool"] == "cpu-standin"
        record = json.loads(worker.record.read_text())
        assert record["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
        assert record["argv"][-2:] == ["--dtype", "float32"]
        command = next(ln for ln in worker.lines() if "command:" in ln)
        assert "vllm.entrypoints.openai.api_server --model tiny-standin" in command
        engine = worker.engine_pid()
        worker.popen.send_signal(signal.SIGTERM)
        assert worker.wait() == 0
        assert not alive(engine)
        assert registered(gateway, worker.url) is None  # deregistered before the engine stopped
        assert "standin" not in models(gateway)
        assert any("deregistered id=cpu-standin-" in ln for ln in worker.lines())
    finally:
        worker.popen.kill()


@pytest.mark.timeout(90)
def test_heartbeat_lapse_removes_and_the_next_beat_restores(stand_in: Path, gateway: Proc,
                                                            tmp_path: Path) -> None:
    worker = WorkerProc(stand_in, gateway.url, tmp_path, ttl_s=1.5)
    try:
        poll(lambda: registered(gateway, worker.url), what="registration")
        worker.popen.send_signal(signal.SIGSTOP)  # no more heartbeats; the engine keeps going
        poll(lambda: registered(gateway, worker.url) is None, timeout=15, what="lapse")
        assert "standin" not in models(gateway)
        worker.popen.send_signal(signal.SIGCONT)
        poll(lambda: registered(gateway, worker.url), timeout=15, what="re-registration")
        worker.popen.send_signal(signal.SIGINT)
        assert worker.wait() == 0
    finally:
        worker.popen.send_signal(signal.SIGCONT)
        worker.popen.kill()


@pytest.mark.timeout(90)
def test_engine_death_deregisters_and_becomes_the_exit_code(stand_in: Path, gateway: Proc,
                                                            tmp_path: Path) -> None:
    worker = WorkerProc(stand_in, gateway.url, tmp_path)
    try:
        poll(lambda: registered(gateway, worker.url), what="registration")
        os.kill(worker.engine_pid(), signal.SIGKILL)
        assert worker.wait() == 128 + signal.SIGKILL
        assert registered(gateway, worker.url) is None
        assert any("engine exited by itself with -9" in ln for ln in worker.lines())
    finally:
        worker.popen.kill()
