"""Soak: mixed load through a real `fleetgate serve` for N minutes with a fault every 30 s.

What it runs (all child processes, on free local ports, killed on exit):

* its own ``redis-server --save ''`` (never the shared one), the gateway's state store
  (``FLEETGATE_REDIS_URL``);
* three emulated engines (``python -m fleetgate.emulator``): two vLLM on H100, one SGLang on
  MI300X, all serving one model, so that a fault on one leaves the others to fail over to;
* ``fleetgate serve`` with auth on (three tenants' keys, one with a concurrency limit, and an
  admin key for ``/admin/reload``) and a cost policy with a TTFT SLO (so a hung engine is
  given up on after the first-byte timeout).

Load: ``--concurrency`` closed-loop workers, each picking at random a tenant and one of chat
(stream or not), completions (stream or not) or responses (not streamed), small
``max_tokens``. A fault every ``--fault-every`` seconds, in turn: SIGKILL an engine (restarted
10 s later on the same port), ``hang`` one (cleared 15 s later), a 503 storm (``down``, 15 s),
a slow-down (``slow_factor`` 8, 15 s), a Redis restart (SIGKILL, back 3 s later, empty), a
config reload (a price changed, ``POST /admin/reload``). Faults run on a fixed schedule (one
per slot); the engine killed is the one with the most requests in flight, so that streams
break mid-way (the gateway resumes them elsewhere or ends them with an error event).

The ledger (one JSON line per request, ``--out``/ledger.jsonl, /tmp/fleetgate-soak by
default) records the status, bytes, latency, for streams whether ``[DONE]`` came and whether
an error event came before it, and a transport error if any. At the end it asserts:

* lost = 0: every request got an HTTP answer (no connection error, no empty reply);
* hung = 0: none took longer than ``--hang-after`` seconds (client-side deadline);
* cut = 0: every chat/completions stream ended with ``data: [DONE]`` (an error event before it
  is a clean end), and every 200 streamed chunk parses as JSON;
* unclean = 0: every non-2xx answer is the OpenAI envelope
  ``{"error": {"message", "type", "param", "code"}}``, and none is a 500;
* memory flat: the gateway's RSS (sampled every 5 s) at the end is within 25 % + 32 MiB of
  its level after the first minute (the first minute is warm-up: imports, JIT, pools).

Writes ``summary.json`` beside the ledger; exit 1 if an assertion fails.

Run: ``.venv/bin/python bench/soak.py --duration 600`` (``make soak``); a 45 s look:
``--duration 45 --fault-every 6``.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

MODEL = "llama-3.1-8b"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"
READY = "FLEETGATE_EMULATOR_READY "
ADMIN = "soak-admin-key-0123456789"
KEYS = {"tenant-a": "soak-key-a-0123456789", "tenant-b": "soak-key-b-0123456789",
        "tenant-c": "soak-key-c-0123456789"}
ENGINES = [("vllm", "h100"), ("vllm", "h100"), ("sglang", "mi300x")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pdeathsig() -> None:  # children die with this process (Linux)
    with contextlib.suppress(Exception):
        import ctypes
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)


# --- the children ------------------------------------------------------------------------------

@dataclass
class Child:
    name: str
    cmd: list[str]
    env: dict[str, str] | None = None
    log: Path | None = None
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        self.popen = subprocess.Popen(self.cmd, env=self.env, stdin=subprocess.DEVNULL,
                                      stdout=out, stderr=subprocess.STDOUT,
                                      preexec_fn=_pdeathsig)

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=10)

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


def wait_http(url: str, timeout: float, what: str, ok: tuple[int, ...] = (200,)) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code in ok:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} ({url}) not up within {timeout}s")


def wait_redis(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5) as s:
            s.sendall(b"PING\r\n")
            if s.recv(16).startswith(b"+PONG"):
                return
        time.sleep(0.05)
    raise RuntimeError("redis did not start")


def fleet_config(engine_urls: list[str], price_bump: float = 0.0) -> dict[str, Any]:
    pools = [
        {"name": "h100-vllm", "accelerator": "h100", "engine": "vllm",
         "price_per_gpu_hour": round(2.49 + price_bump, 2), "endpoints": engine_urls[:2],
         "models": {MODEL: SERVED}},
        {"name": "mi300x-sglang", "accelerator": "mi300x", "engine": "sglang",
         "price_per_gpu_hour": 1.99, "endpoints": engine_urls[2:],
         "models": {MODEL: SERVED}},
    ]
    return {
        "pools": pools,
        "policies": {"cheapest": {"strategy": "cost", "slo": {"ttft_ms": 1000, "tpot_ms": 200}},
                     "rr": {"strategy": "round_robin", "slo": {"ttft_ms": 1000}}},
        "routes": [{"match": {"tenant": "tenant-b"}, "policy": "rr"}],
        "default_policy": "cheapest",
        "auth": {"admin_keys": [ADMIN], "keys": [
            {"name": "a", "key": KEYS["tenant-a"], "tenant": "tenant-a"},
            {"name": "b", "key": KEYS["tenant-b"], "tenant": "tenant-b", "priority": "high"},
            {"name": "c", "key": KEYS["tenant-c"], "tenant": "tenant-c",
             "limits": {"concurrency": 2}, "priority": "low"},
        ]},
    }


# --- the ledger --------------------------------------------------------------------------------

@dataclass
class Entry:
    i: int
    t: float  # seconds since the load started
    kind: str
    tenant: str
    stream: bool
    fault: str
    status: int | None = None
    bytes: int = 0
    latency_s: float = 0.0
    done: bool | None = None  # streams: data: [DONE] was the last frame
    error_event: bool = False  # streams: an error event came (before [DONE])
    bad_frame: bool = False  # streams: a data frame that is not JSON
    envelope_ok: bool | None = None  # non-2xx: the OpenAI error envelope
    transport: str | None = None  # a client-side error: no (complete) answer
    hung: bool = False


def _envelope_ok(body: bytes) -> bool:
    try:
        err = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(err, dict) and {"message", "type", "param", "code"} <= err.keys() \
        and isinstance(err["message"], str) and bool(err["message"])


def _request(kind: str, stream: bool, rng: random.Random) -> tuple[str, dict[str, Any]]:
    n = rng.randint(8, 160)
    text = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "soak", "fleet"])
                    for _ in range(rng.randint(3, 60)))
    if kind == "chat":
        body: dict[str, Any] = {"model": MODEL, "max_tokens": n,
                                "messages": [{"role": "user", "content": text}]}
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        return "/v1/chat/completions", body
    if kind == "completions":
        body = {"model": MODEL, "max_tokens": n, "prompt": text}
        if stream:
            body["stream"] = True
        return "/v1/completions", body
    return "/v1/responses", {"model": MODEL, "max_output_tokens": n, "input": text}


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix="fleetgate-soak-"))
        self.rng = random.Random(args.seed)
        self.ledger: list[Entry] = []
        self.fault = "none"
        self.faults: list[dict[str, Any]] = []
        self.rss: list[tuple[float, int]] = []
        self.t0 = 0.0
        self.stop_load = False
        self.redis_port = free_port()
        self.redis = Child("redis", ["redis-server", "--port", str(self.redis_port), "--save", "",
                                     "--appendonly", "no", "--bind", "127.0.0.1"],
                           log=self.tmp / "redis.log")
        self.engine_ports = [free_port() for _ in ENGINES]
        self.engines = [
            Child(f"{e}-{g}-{i}", [sys.executable, "-m", "fleetgate.emulator", "--engine", e,
                                   "--gpu", g, "--model", SERVED, "--port", str(p),
                                   "--speed", str(args.speed)], log=self.tmp / f"engine{i}.log")
            for i, ((e, g), p) in enumerate(zip(ENGINES, self.engine_ports, strict=True))]
        self.engine_urls = [f"http://127.0.0.1:{p}" for p in self.engine_ports]
        self.config_path = self.tmp / "fleet.yaml"
        self.config_path.write_text(yaml.safe_dump(fleet_config(self.engine_urls)))
        self.gw_port = free_port()
        self.gw_url = f"http://127.0.0.1:{self.gw_port}"
        env = {**os.environ, "FLEETGATE_REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
               "FLEETGATE_REDIS_PREFIX": "soak:", "FLEETGATE_HEALTH_INTERVAL_S": "0.5",
               "FLEETGATE_REQUEST_LOG": "off", "FLEETGATE_READ_TIMEOUT_S": "20",
               "FLEETGATE_LOG_LEVEL": "warning"}
        self.gateway = Child("gateway", [sys.executable, "-m", "fleetgate.cli", "serve",
                                         "--config", str(self.config_path),
                                         "--port", str(self.gw_port)],
                             env=env, log=self.tmp / "gateway.log")

    # -- lifecycle

    def start(self) -> None:
        self.redis.start()
        wait_redis(self.redis_port)
        for e in self.engines:
            e.start()
        for e, url in zip(self.engines, self.engine_urls, strict=True):
            wait_http(url + "/emulator/faults", 60, e.name)
        self.gateway.start()
        wait_http(self.gw_url + "/readyz", 90, "gateway")

    def close(self) -> None:
        for c in [self.gateway, *self.engines, self.redis]:
            c.stop()

    # -- load

    async def worker(self, client: httpx.AsyncClient, wid: int) -> None:
        rng = random.Random(self.args.seed * 1000 + wid)
        while not self.stop_load:
            tenant = rng.choices(list(KEYS), [4, 4, 2])[0]
            kind = rng.choices(["chat", "completions", "responses"], [5, 3, 2])[0]
            stream = kind != "responses" and rng.random() < 0.6
            path, body = _request(kind, stream, rng)
            entry = Entry(len(self.ledger), round(time.monotonic() - self.t0, 3), kind, tenant,
                          stream, self.fault)
            self.ledger.append(entry)
            await self.one(client, entry, path, body, KEYS[tenant])

    async def one(self, client: httpx.AsyncClient, e: Entry, path: str, body: dict[str, Any],
                  key: str) -> None:
        start = time.monotonic()
        buf = b""
        try:
            async with asyncio.timeout(self.args.hang_after):
                async with client.stream("POST", path, json=body,
                                         headers={"authorization": f"Bearer {key}"}) as r:
                    e.status = r.status_code
                    async for chunk in r.aiter_raw():
                        buf += chunk
        except TimeoutError:
            e.hung = True
            e.transport = "timeout"
        except httpx.HTTPError as exc:
            e.transport = f"{type(exc).__name__}: {exc}"[:200]
        e.latency_s = round(time.monotonic() - start, 4)
        e.bytes = len(buf)
        if e.status is None:
            return
        if e.status >= 300:
            e.envelope_ok = _envelope_ok(buf)
            return
        if not e.stream:
            try:
                json.loads(buf)
            except ValueError:
                e.bad_frame = True
            return
        frames = [f for f in buf.replace(b"\r\n", b"\n").split(b"\n\n") if f.strip()]
        datas = [f[5:].strip() for f in frames if f.startswith(b"data:")]
        e.done = bool(datas) and datas[-1] == b"[DONE]"
        for d in datas[:-1] if e.done else datas:
            try:
                obj = json.loads(d)
            except ValueError:
                e.bad_frame = True
                continue
            if isinstance(obj, dict) and "error" in obj:
                e.error_event = True

    # -- faults

    async def faults_loop(self, client: httpx.AsyncClient) -> None:
        kinds = ["kill", "hang", "down", "slow", "redis", "reload"]
        n = 0
        while not self.stop_load:  # one fault per slot, on a fixed schedule
            await asyncio.sleep(max(0.0, self.t0 + (n + 1) * self.args.fault_every
                                    - time.monotonic()))
            if self.stop_load:
                break
            kind = kinds[n % len(kinds)]
            idx = (n + n // len(kinds)) % len(self.engines)  # each fault meets each engine
            n += 1
            rec = {"t": round(time.monotonic() - self.t0, 1), "fault": kind}
            self.fault = kind
            try:
                rec |= await self.inject(client, kind, idx)
            except Exception as exc:  # a fault that could not be set is reported, not fatal
                rec["inject_error"] = repr(exc)
            self.faults.append(rec)
            self.fault = "none"

    async def inject(self, client: httpx.AsyncClient, kind: str, idx: int) -> dict[str, Any]:
        hold = min(15.0, self.args.fault_every / 2)
        if kind == "kill":  # the busiest engine, so that streams break mid-way
            busy = []
            for i, u in enumerate(self.engine_urls):
                try:
                    busy.append(((await client.get(u + "/emulator/state")).json()["in_flight"],
                                 i))
                except (httpx.HTTPError, ValueError, KeyError):
                    continue
            idx = max(busy)[1] if busy else idx
        engine, url = self.engines[idx], self.engine_urls[idx]
        if kind == "kill":
            in_flight = max(busy)[0] if busy else None
            engine.kill()
            await asyncio.sleep(min(10.0, self.args.fault_every / 3))
            engine.start()
            await asyncio.to_thread(wait_http, url + "/emulator/faults", 60, engine.name)
            return {"engine": engine.name, "in_flight_when_killed": in_flight}
        if kind in ("hang", "down", "slow"):
            on: dict[str, Any] = {"hang": {"hang": True}, "down": {"down": True},
                                  "slow": {"slow_factor": 8.0}}[kind]
            off: dict[str, Any] = {"hang": {"hang": False}, "down": {"down": False},
                                   "slow": {"slow_factor": 1.0}}[kind]
            (await client.post(url + "/emulator/faults", json=on)).raise_for_status()
            await asyncio.sleep(hold)
            (await client.post(url + "/emulator/faults", json=off)).raise_for_status()
            return {"engine": engine.name}
        if kind == "redis":
            self.redis.kill()
            await asyncio.sleep(3.0)
            self.redis.start()
            await asyncio.to_thread(wait_redis, self.redis_port)
            return {}
        # reload: a changed price, re-read
        bump = self.rng.choice([0.0, 0.1, 0.2])
        self.config_path.write_text(yaml.safe_dump(fleet_config(self.engine_urls, bump)))
        r = await client.post(self.gw_url + "/admin/reload",
                              headers={"authorization": f"Bearer {ADMIN}"})
        return {"reload_status": r.status_code}

    async def rss_loop(self) -> None:
        assert self.gateway.popen is not None
        proc = psutil.Process(self.gateway.popen.pid)
        while not self.stop_load:
            with contextlib.suppress(psutil.Error):
                self.rss.append((round(time.monotonic() - self.t0, 1), proc.memory_info().rss))
            await asyncio.sleep(self.args.rss_every)

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=self.args.concurrency + 8)
        timeout = httpx.Timeout(self.args.hang_after + 5)
        async with httpx.AsyncClient(base_url=self.gw_url, limits=limits, timeout=timeout) as c, \
                httpx.AsyncClient(timeout=30) as control:
            self.t0 = time.monotonic()
            workers = [asyncio.create_task(self.worker(c, i))
                       for i in range(self.args.concurrency)]
            side = [asyncio.create_task(self.faults_loop(control)),
                    asyncio.create_task(self.rss_loop())]
            await asyncio.sleep(self.args.duration)
            self.stop_load = True
            await asyncio.gather(*workers)
            for t in side:
                t.cancel()
            await asyncio.gather(*side, return_exceptions=True)
            # leave the fleet as it was (a fault cut short by the end)
            for url in self.engine_urls:
                with contextlib.suppress(httpx.HTTPError):
                    await control.post(url + "/emulator/faults",
                                       json={"hang": False, "down": False, "slow_factor": 1.0})

    # -- the verdict

    def summary(self) -> dict[str, Any]:
        led = self.ledger
        by_status: dict[str, int] = {}
        for e in led:
            k = str(e.status) if e.status is not None else "none"
            by_status[k] = by_status.get(k, 0) + 1
        streams = [e for e in led if e.stream and e.status is not None and e.status < 300]
        lost = [e for e in led if e.transport is not None and not e.hung]
        hung = [e for e in led if e.hung]
        cut = [e for e in streams if not e.done and not e.hung and e.transport is None]
        bad_frames = [e for e in led if e.bad_frame]
        unclean = [e for e in led if e.status is not None and e.status >= 300
                   and (not e.envelope_ok or e.status == 500)]
        lat = sorted(e.latency_s for e in led if e.status is not None)
        warm = [r for t, r in self.rss if t >= min(60.0, self.args.duration / 4)]
        rss_start = statistics.median(warm[:6]) if warm else 0
        rss_end = statistics.median(warm[-6:]) if warm else 0
        flat = rss_end <= rss_start * 1.25 + 32 * 2**20
        return {
            "duration_s": self.args.duration, "fault_every_s": self.args.fault_every,
            "concurrency": self.args.concurrency, "engine_speed": self.args.speed,
            "requests": len(led), "by_status": dict(sorted(by_status.items())),
            "by_kind": {k: sum(1 for e in led if e.kind == k) for k in
                        ("chat", "completions", "responses")},
            "streams_ok": sum(1 for e in streams if e.done and not e.error_event),
            "streams_with_error_event_then_done": sum(1 for e in streams
                                                      if e.done and e.error_event),
            "lost": len(lost), "hung": len(hung), "cut": len(cut),
            "bad_frames": len(bad_frames), "unclean_errors": len(unclean),
            "status_500": by_status.get("500", 0),
            "latency_p50_s": lat[len(lat) // 2] if lat else None,
            "latency_p99_s": lat[int(len(lat) * 0.99)] if lat else None,
            "latency_max_s": lat[-1] if lat else None,
            "faults": self.faults,
            "rss_mib": {"first": round(self.rss[0][1] / 2**20, 1) if self.rss else None,
                        "start": round(rss_start / 2**20, 1), "end": round(rss_end / 2**20, 1),
                        "max": round(max(r for _, r in self.rss) / 2**20, 1)
                        if self.rss else None, "samples": len(self.rss)},
            "memory_flat": flat,
            "examples": {"lost": [asdict(e) for e in lost[:5]],
                         "hung": [asdict(e) for e in hung[:5]],
                         "cut": [asdict(e) for e in cut[:5]],
                         "unclean": [asdict(e) for e in unclean[:5]]},
            "ok": not lost and not hung and not cut and not unclean and not bad_frames and flat,
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--fault-every", type=float, default=30.0)
    p.add_argument("--concurrency", type=int, default=12)
    p.add_argument("--speed", type=float, default=2.0, help="emulated engines' clock speed")
    p.add_argument("--hang-after", type=float, default=60.0,
                   help="a request without its whole answer after this long counts as hung")
    p.add_argument("--rss-every", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=15)
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "fleetgate-soak"))
    args = p.parse_args(argv)
    soak = Soak(args)
    try:
        soak.start()
        asyncio.run(soak.run())
    finally:
        soak.close()
    out = Path(args.out)
    with open(out / "ledger.jsonl", "w") as f:
        for e in soak.ledger:
            f.write(json.dumps(asdict(e)) + "\n")
    summary = soak.summary()
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    short = {k: v for k, v in summary.items() if k not in ("faults", "examples")}
    print(json.dumps(short, indent=2))
    print(f"ledger: {out / 'ledger.jsonl'}  summary: {out / 'summary.json'}  logs: {soak.tmp}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
