"""Schemathesis against a real gateway's ``/openapi.json``, every response counted.

Two real ``fleetgate serve`` processes over the same three emulated engines (vLLM on H100 and
SGLang on MI300X serving ``llama-3.1-8b``, a vLLM embeddings engine): one open, one with auth
on (tenant keys and an admin key). For every operation of the served OpenAPI document,
schemathesis generates cases in both its modes (``positive``: valid by the schema;
``negative``: violating it), round after round with new seeds until the target number of
requests is reached; each case is sent over real HTTP (``requests``, read to the end) and
its answer checked:

* no 500 and no other 5xx besides 502/503/504 (``server_error``);
* a 502/503/504 only where an upstream failed: the case is replayed on the engines directly
  (served model name); if none of them fails it (5xx or no answer), the 502/503/504 is a
  finding (``upstream_error``), else it is counted as ``upstream_failed``;
* no dropped connection (``dropped``: a connection error, a reset, a body cut short) and no
  answer slower than the client's deadline (``timeout``);
* every non-2xx answer is the OpenAI envelope ``{"error": {"message", "type", "param",
  "code"}}`` (``not_envelope``);
* every 200 event stream of chat/completions ends with ``data: [DONE]`` (``stream_cut``).

To reach past the model-name check, a generated JSON object body gets, half of the time, a
served model name, and its token counts are capped (``max_tokens`` and the like at 256,
``n`` / ``best_of`` at 4) so a case costs milliseconds of emulated generation. On the
auth-on gateway a case carries a tenant key (70 %), the admin key, a wrong key or none.

A second profile, ``typewrong`` (``typewrong.py``), sends every field of OpenAI's and
Anthropic's published request schemas with values of the wrong type or out of range (not
only the fields the gateway's own document lists) and counts 500s, 502s a request caused,
non-envelope bodies and dropped connections.

``python tests/fuzz/fuzz_harness.py --cases 10000`` (``make fuzz``) runs both profiles
(``--profile schema|typewrong|all``), prints the counts as JSON and exits 1 on any finding;
``tests/fuzz/test_fuzz_smoke.py`` runs 1,000 schema cases and 1,000 type-wrong cases in
``make test``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from schemathesis.generation import GenerationMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/ (procs.py)

from typewrong import run_typewrong

from procs import PUBLIC_8B, SERVED_8B, Proc, pool, spawn_emulator, spawn_gateway

EMBED_PUBLIC, EMBED_SERVED = "bge-large-en", "BAAI/bge-large-en-v1.5"
ADMIN = "fuzz-admin-key-0123456789"
TENANT = "fuzz-tenant-key-0123456789"
TOKEN_FIELDS = {"max_tokens", "max_completion_tokens", "max_output_tokens", "min_tokens"}
SMALL_FIELDS = {"n", "best_of", "top_logprobs", "logprobs"}
STREAM_END = {"/v1/chat/completions", "/v1/completions"}
INFERENCE_PATHS = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                   "/v1/embeddings"}
FINDINGS = ("server_error", "upstream_error", "dropped", "timeout", "not_envelope",
            "stream_cut")


@dataclass
class Tally:
    cases: int = 0
    unsendable: int = 0  # the client refused to send it (e.g. a header requests rejects)
    by_status: Counter[int] = field(default_factory=Counter)
    by_gateway: dict[str, Counter[int]] = field(default_factory=dict)
    by_operation: dict[str, Counter[int]] = field(default_factory=dict)
    by_mode: Counter[str] = field(default_factory=Counter)
    findings: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in FINDINGS})
    # 502/503/504 whose request the engine itself fails when sent to it directly
    upstream_failed: list[str] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        return {
            "cases": self.cases, "unsendable": self.unsendable,
            "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
            "by_gateway": {g: {str(k): v for k, v in sorted(c.items())}
                           for g, c in self.by_gateway.items()},
            "by_operation": {o: {str(k): v for k, v in sorted(c.items())}
                             for o, c in sorted(self.by_operation.items())},
            "by_mode": dict(self.by_mode),
            "upstream_failed": len(self.upstream_failed),
            "upstream_failed_examples": self.upstream_failed[:5],
            "findings": {k: len(v) for k, v in self.findings.items()},
            "examples": {k: v[:5] for k, v in self.findings.items() if v},
        }

    @property
    def clean(self) -> bool:
        return not any(self.findings.values())


def _envelope_ok(body: bytes) -> bool:
    try:
        err = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(err, dict) and {"message", "type", "param", "code"} <= err.keys() \
        and isinstance(err["message"], str) and bool(err["message"])


def _steer(case: Any, rng: random.Random) -> None:
    """Half the JSON object bodies name a served model; token counts are capped."""
    body = case.body
    if not isinstance(body, dict):
        return
    if rng.random() < 0.5:
        body["model"] = EMBED_PUBLIC if case.path == "/v1/embeddings" else PUBLIC_8B
    for key, value in list(body.items()):
        if isinstance(value, int) and not isinstance(value, bool):
            if key in TOKEN_FIELDS and value > 256:
                body[key] = 256
            elif key in SMALL_FIELDS and value > 4:
                body[key] = 4


def _describe(case: Any, status: Any, body: bytes | str) -> str:
    text = body if isinstance(body, str) else body[:300].decode("utf-8", "replace")
    try:
        sent = json.dumps(case.body)
    except (TypeError, ValueError):
        sent = repr(case.body)
    return (f"{case.method} {case.formatted_path} query={case.query!r} "
            f"headers={case.headers!r} body={sent[:4000]} -> {status}: {text[:300]}")


class Fuzzer:
    def __init__(self, gateways: dict[str, tuple[str, bool]],
                 engines: dict[str, list[tuple[str, str]]], timeout: float = 30.0,
                 seed_: int = 0) -> None:
        self.gateways = gateways  # name -> (url, auth on)
        self.engines = engines  # "chat" / "embed" -> [(engine url, served model)]
        self.timeout = timeout
        self.seed = seed_
        self.rng = random.Random(seed_)
        self.tally = Tally()
        self.sessions = {name: requests.Session() for name in gateways}

    def _upstream_fails(self, case: Any) -> bool:
        """Replay the case on the engines directly (served model name): does any of them
        fail it (5xx, or no answer)? Then the gateway's 502/503/504 is the upstream's."""
        if not isinstance(case.body, dict) or case.path not in INFERENCE_PATHS:
            return False
        engines = self.engines.get("embed" if case.path == "/v1/embeddings" else "chat", [])
        for url, served in engines:
            body = {**case.body, "model": served}
            try:
                r = requests.post(url + case.path, json=body, timeout=self.timeout)
            except requests.exceptions.RequestException:
                return True
            if r.status_code >= 500:
                return True
        return False

    def _document(self, url: str, auth_on: bool) -> dict[str, Any]:
        """The served document (behind the admin key when auth is on, issue 24 item 7)."""
        headers = {"authorization": f"Bearer {ADMIN}"} if auth_on else {}
        resp = requests.get(url + "/openapi.json", headers=headers, timeout=self.timeout)
        resp.raise_for_status()
        return resp.json()  # type: ignore[no-any-return]

    def _auth(self, auth_on: bool) -> dict[str, str]:
        if not auth_on:
            return {}
        roll = self.rng.random()
        if roll < 0.7:
            return {"authorization": f"Bearer {TENANT}"}
        if roll < 0.8:
            return {"authorization": f"Bearer {ADMIN}"}
        if roll < 0.9:
            return {"authorization": "Bearer wrong-key-0123456789abcdef"}
        return {}

    def send(self, gw: str, case: Any, mode: str) -> None:
        url, auth_on = self.gateways[gw]
        _steer(case, self.rng)
        headers = {**(case.headers or {}), **self._auth(auth_on)}
        t = self.tally
        try:
            # sent by us, not case.call(): schemathesis stops reading an event stream after a
            # number of events and retries a dropped connection, both of which would hide
            # what this harness counts
            kwargs = case.as_transport_kwargs(base_url=url, headers=headers)
            kwargs["timeout"] = self.timeout
            resp = self.sessions[gw].request(**kwargs)
            body = resp.content
        except (requests.exceptions.InvalidHeader, requests.exceptions.InvalidURL,
                UnicodeEncodeError):
            t.unsendable += 1
            return
        except requests.exceptions.Timeout as exc:
            t.cases += 1
            t.findings["timeout"].append(_describe(case, "timeout", repr(exc)))
            return
        except requests.exceptions.RequestException as exc:  # reset, refused, cut body
            t.cases += 1
            t.findings["dropped"].append(_describe(case, "dropped", repr(exc)))
            self.sessions[gw] = requests.Session()
            return
        t.cases += 1
        status = resp.status_code
        t.by_status[status] += 1
        t.by_gateway.setdefault(gw, Counter())[status] += 1
        t.by_operation.setdefault(f"{case.method} {case.path}", Counter())[status] += 1
        t.by_mode[mode] += 1
        if status >= 500 and status not in (502, 503, 504):
            t.findings["server_error"].append(_describe(case, status, body))
        elif status in (502, 503, 504):
            if self._upstream_fails(case):
                t.upstream_failed.append(_describe(case, status, body))
            else:
                t.findings["upstream_error"].append(_describe(case, status, body))
        if status >= 400 and not _envelope_ok(body):
            t.findings["not_envelope"].append(_describe(case, status, body))
        if status == 200 and case.path in STREAM_END \
                and "text/event-stream" in resp.headers.get("content-type", ""):
            frames = [f for f in body.replace(b"\r\n", b"\n").split(b"\n\n") if f.strip()]
            if not frames or frames[-1].strip() != b"data: [DONE]":
                t.findings["stream_cut"].append(_describe(case, status, body[-300:]))

    def run(self, target: int, per_round: int = 25) -> Tally:
        schemas = {gw: schemathesis.openapi.from_dict(self._document(url, auth_on))
                   for gw, (url, auth_on) in self.gateways.items()}
        ops = {gw: [r.ok() for r in s.get_all_operations()] for gw, s in schemas.items()}
        round_no = 0
        while self.tally.cases < target:
            round_no += 1
            before = self.tally.cases
            for i in range(max(len(o) for o in ops.values())):
                for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                    for gw, operations in ops.items():
                        if self.tally.cases >= target:
                            return self.tally
                        if i < len(operations):
                            self._explore(gw, operations[i], mode, per_round, round_no)
            if self.tally.cases == before:
                break  # nothing more can be generated
        return self.tally

    def _explore(self, gw: str, op: Any, mode: GenerationMode, n: int, round_no: int) -> None:
        @seed(self.seed * 1_000_003 + round_no * 7919
              + zlib.crc32(f"{gw} {op.method} {op.path} {mode.value}".encode()))
        @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck), derandomize=False)
        @given(case=op.as_strategy(generation_mode=mode))
        def explore(case: Any) -> None:
            self.send(gw, case, mode.value)

        try:
            explore()
        except Exception as exc:  # e.g. an operation schemathesis cannot generate for
            if "Unsatisfiable" not in type(exc).__name__ and "Unsatisfied" not in repr(exc):
                raise


@contextmanager
def fuzz_fleet(tmp: Path, speed: float = 200.0) -> Iterator[dict[str, tuple[str, bool]]]:
    """The engines and the two gateways (open, auth on) over them."""
    procs: list[Proc] = []
    try:
        vllm = spawn_emulator("vllm", "h100", [SERVED_8B], speed=speed)
        procs.append(vllm)
        sglang = spawn_emulator("sglang", "mi300x", [SERVED_8B], speed=speed)
        procs.append(sglang)
        embed = spawn_emulator("vllm", "mi300x", [EMBED_SERVED], speed=speed)
        procs.append(embed)
        pools = [
            pool("h100-vllm", "h100", "vllm", 2.95, [vllm.url], {PUBLIC_8B: SERVED_8B}),
            pool("mi300x-sglang", "mi300x", "sglang", 1.99, [sglang.url],
                 {PUBLIC_8B: SERVED_8B}),
            pool("mi300x-embed", "mi300x", "vllm", 1.99, [embed.url],
                 {EMBED_PUBLIC: EMBED_SERVED}) | {"apis": ["embeddings"]},
        ]
        env = {"FLEETGATE_REQUEST_LOG": "off", "FLEETGATE_LOG_LEVEL": "warning"}
        open_gw = spawn_gateway({"pools": pools}, tmp, env=env)
        procs.append(open_gw)
        auth = {"admin_keys": [ADMIN],
                "keys": [{"name": "fuzz", "key": TENANT, "tenant": "fuzz"}]}
        auth_gw = spawn_gateway({"pools": pools, "auth": auth}, tmp, env=env)
        procs.append(auth_gw)
        yield ({"open": (open_gw.url, False), "auth": (auth_gw.url, True)},
               {"chat": [(vllm.url, SERVED_8B), (sglang.url, SERVED_8B)],
                "embed": [(embed.url, EMBED_SERVED)]})
    finally:
        for p in reversed(procs):
            p.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="schemathesis against a real fleetgate")
    p.add_argument("--cases", type=int, default=10_000)
    p.add_argument("--per-round", type=int, default=25,
                   help="examples per operation and mode in one round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the report JSON here too")
    p.add_argument("--profile", choices=("schema", "typewrong", "all"), default="all",
                   help="schema: schemathesis on /openapi.json; typewrong: every OpenAI field "
                        "with wrong-typed values (typewrong.py); all: both, --cases each")
    args = p.parse_args(argv)
    start = time.monotonic()
    report: dict[str, Any] = {}
    clean = True
    with tempfile.TemporaryDirectory(prefix="fleetgate-fuzz-") as tmp, \
            fuzz_fleet(Path(tmp)) as (gateways, engines):
        if args.profile in ("schema", "all"):
            tally = Fuzzer(gateways, engines, seed_=args.seed).run(args.cases, args.per_round)
            report["schema"] = tally.report()
            clean = clean and tally.clean and tally.cases >= args.cases
        if args.profile in ("typewrong", "all"):
            wrong = run_typewrong(typewrong_targets(gateways), TYPEWRONG_MODELS, args.cases,
                                  args.seed)
            report["typewrong"] = wrong.report()
            clean = clean and wrong.clean
    report |= {"seconds": round(time.monotonic() - start, 1), "clean": clean}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if clean else 1


TYPEWRONG_MODELS = {"chat": PUBLIC_8B, "completions": PUBLIC_8B, "messages": PUBLIC_8B,
                    "responses": PUBLIC_8B, "embeddings": EMBED_PUBLIC}


def typewrong_targets(gateways: dict[str, tuple[str, bool]]
                      ) -> dict[str, tuple[str, dict[str, str]]]:
    """Each gateway with what a tenant sends (its key when auth is on)."""
    return {gw: (url, {"authorization": f"Bearer {TENANT}"} if auth_on else {})
            for gw, (url, auth_on) in gateways.items()}


if __name__ == "__main__":
    raise SystemExit(main())
