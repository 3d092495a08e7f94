"""``python -m fleetgate.emulator``: run one emulated engine server (argparse entry).

The launcher uses it to start child emulators; ``fleetgate emulate`` is the user-facing
command. May touch: argv, the launcher. Must not touch: anything else.
"""

from __future__ import annotations

import argparse
import os
import sys

from pydantic import ValidationError

from fleetgate.emulator.config import EmulatorConfig
from fleetgate.emulator.launcher import run_emulator


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fleetgate.emulator",
        description="Run an emulated vLLM or SGLang engine server.",
    )
    p.add_argument("--engine", required=True, choices=["vllm", "sglang"])
    p.add_argument("--gpu", required=True)
    p.add_argument(
        "--model",
        required=True,
        action="append",
        dest="models",
        help="served model name (repeatable; vLLM reports the first)",
    )
    p.add_argument("--profile", default=None, help="model profile, e.g. llama-3.1-70b-fp8")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 = a free port")
    p.add_argument("--speed", type=float, default=1.0, help="run the clock X times faster")
    p.add_argument("--stack", default="stock", choices=["stock", "tuned"])
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel degree")
    p.add_argument("--max-queued-requests", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="batch cap (SGLang: --max-running-requests)")
    p.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters")
    p.add_argument("--lora-modules", "--lora-paths", nargs="+", default=[], metavar="NAME=PATH",
                   help="adapters served from the start (implies --enable-lora)")
    p.add_argument("--max-loras", "--max-loras-per-batch", type=int, default=None,
                   help="distinct adapters in one batch (vLLM default 1, SGLang 8)")
    p.add_argument("--allow-runtime-lora", action="store_true",
                   help="vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING=True: /v1/load_lora_adapter "
                        "and /v1/unload_lora_adapter (also read from that variable)")
    p.add_argument(
        "--exit-on-stdin-eof",
        action="store_true",
        help="exit when stdin closes (set by the launcher: dies with its parent)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    modules = {}
    for item in args.lora_modules:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            print(f"invalid --lora-modules entry {item!r}: NAME=PATH", file=sys.stderr)
            return 2
        modules[name] = path
    runtime = args.allow_runtime_lora or os.environ.get(
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true")
    try:
        config = EmulatorConfig(
            engine=args.engine,
            gpu=args.gpu,
            served_models=args.models,
            profile=args.profile,
            speed=args.speed,
            stack=args.stack,
            tp=args.tp,
            max_queued_requests=args.max_queued_requests,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            enable_lora=args.enable_lora,
            lora_modules=modules,
            max_loras=args.max_loras,
            runtime_lora=runtime,
        )
    except ValidationError as exc:
        print(f"invalid emulator settings:\n{exc}", file=sys.stderr)
        return 2
    run_emulator(config, args.host, args.port, exit_on_stdin_eof=args.exit_on_stdin_eof)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
