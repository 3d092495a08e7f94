"""guidellm against a running gateway (issue 25 item 1): a short synchronous benchmark.

``fleetgate serve`` on the embedded default fleet (``config/default.yaml``: emulated vLLM
and SGLang engines, what ``make run`` serves), then ``guidellm run`` as a user would type
it: five synchronous requests of synthetic text (32 prompt tokens, 16 output tokens each)
over the streaming ``/v1/chat/completions`` API, guidellm's default request format. The
test reads guidellm's JSON report: every request successful, none errored or incomplete,
the profile synchronous, each response streamed (several token chunks, a time to first
token) with exactly the 16 output tokens guidellm asked for (``max_completion_tokens``
with ``ignore_eos``), and the model guidellm found on ``GET /v1/models``. Before any
request guidellm checks the backend with ``GET /health`` (served for it:
``gateway/api/health.py``); a non-2xx there fails the run.

guidellm lives in its own venv, never the gateway's: 0.4 and later require torch (0.8's
data loader imports ``torch.utils.data``), and with it transformers and datasets. The pin
is guidellm 0.8.1, the release users run (issue 25), beside torch's CPU build; ``make
guidellm-venv`` builds it in ``.venv-guidellm`` and ``make test`` passes its executable
as ``FLEETGATE_GUIDELLM``. Without that variable the test uses ``.venv-guidellm`` if it
exists and skips otherwise; with it set (or ``FLEETGATE_REQUIRE_GUIDELLM=1``) a missing
executable fails the test.

guidellm needs a tokenizer to make synthetic prompts of a given length, and there is no
network here (``HF_HUB_OFFLINE=1``): the guidellm venv's python trains a tiny byte-level
BPE tokenizer (``tokenizers`` and ``transformers``, guidellm dependencies that the
gateway's venv lacks) into the test's temporary folder, passed as ``--tokenizer``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fleetgate.config.loader import default_config_path
from procs import PUBLIC_8B, spawn_gateway

REPO = Path(__file__).resolve().parents[2]
REQUESTS = 5
PROMPT_TOKENS = 32
OUTPUT_TOKENS = 16

# Run by the guidellm venv's python: argv[1] is the folder to save the tokenizer in.
MAKE_TOKENIZER = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

tok = Tokenizer(models.BPE(unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
corpus = ["the quick brown fox jumps over the lazy dog " * 20,
          "a gateway routes every request to the cheapest replica " * 20]
tok.train_from_iterator(corpus, trainers.BpeTrainer(
    vocab_size=300, special_tokens=["[UNK]"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(sys.argv[1])
"""


def _guidellm() -> Path:
    named = os.environ.get("FLEETGATE_GUIDELLM")
    required = bool(named) or os.environ.get("FLEETGATE_REQUIRE_GUIDELLM") == "1"
    path = Path(named) if named else REPO / ".venv-guidellm" / "bin" / "guidellm"
    if not (path.is_file() and os.access(path, os.X_OK)):
        if required:
            pytest.fail(f"no guidellm executable at {path} (make guidellm-venv builds it)")
        pytest.skip(f"no guidellm at {path}: make guidellm-venv builds it (make test does)")
    return path


def _tail(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


def test_guidellm_synchronous_benchmark_against_the_gateway(tmp_path: Path) -> None:
    guidellm = _guidellm()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    tokenizer = tmp_path / "tokenizer"
    made = subprocess.run([str(guidellm.with_name("python")), "-c", MAKE_TOKENIZER,
                           str(tokenizer)],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert made.returncode == 0, _tail(made)

    out = tmp_path / "benchmarks.json"
    gateway = spawn_gateway(default_config_path(), tmp_path)
    try:
        done = subprocess.run(
            [str(guidellm), "run",
             "--backend", f"kind=openai_http,target={gateway.url}",
             "--profile", "kind=synchronous",
             "--constraint", f"kind=max_requests,count={REQUESTS}",
             "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},"
                       f"output_tokens={OUTPUT_TOKENS}",
             "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
             "--output", f"kind=json,path={out}",
             "--disable-progress"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90, check=False)
    finally:
        gateway.stop()
    assert done.returncode == 0, _tail(done)

    report = json.loads(out.read_text())
    [bench] = report["benchmarks"]
    assert bench["config"]["profile"]["kind"] == "synchronous"
    assert bench["config"]["strategy"]["type_"] == "synchronous"
    assert bench["metrics"]["request_totals"] == {
        "successful": REQUESTS, "errored": 0, "incomplete": 0, "total": REQUESTS}, _tail(done)
    requests = bench["requests"]
    assert (requests["errored"], requests["incomplete"]) == ([], []), _tail(done)
    assert len(requests["successful"]) == REQUESTS
    for req in requests["successful"]:
        _check_request(req)
    for metric in ("time_to_first_token_ms", "inter_token_latency_ms"):
        measured = bench["metrics"][metric]["successful"]
        assert measured["count"] > 0 and measured["mean"] > 0, (metric, measured)


def _check_request(req: dict[str, Any]) -> None:
    body = json.loads(req["request_args"])["body"]
    assert body["model"] == PUBLIC_8B  # the one model GET /v1/models lists
    assert body["stream"] is True
    assert body["max_completion_tokens"] == OUTPUT_TOKENS
    assert req["info"]["status"] == "completed" and req["info"]["error"] is None
    assert req["output_tokens"] == OUTPUT_TOKENS, req
    assert req["prompt_tokens"] > 0 and req["output"], req
    assert req["info"]["timings"]["token_iterations"] > 1, "the response was not streamed"
    assert 0 < req["time_to_first_token_ms"] < req["request_latency"] * 1000
