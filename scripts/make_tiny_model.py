"""Build a tiny random-weight Llama model with a real BPE tokenizer and a chat template, offline.

    python scripts/make_tiny_model.py OUT_DIR [--vocab-size N] [--seed S]

What it makes (a few MB, served by vLLM on 2 CPU cores in well under a second per request):

- ``config.json`` + ``model.safetensors``: ``LlamaForCausalLM``, 2 layers, hidden 256, 4 attention
  heads of 64 (2 KV heads, so GQA is exercised), 2048 positions, float32, random weights from
  ``--seed`` (deterministic: the same seed and Python give the same bytes).
- a byte-level BPE tokenizer trained here, with the ``tokenizers`` library, on text that is
  on every machine: the docstrings of a fixed list of Python standard-library modules. No
  download, no hub access (run it with ``HF_HUB_OFFLINE=1`` to be sure).
- a ChatML chat template (``<|im_start|>role\\n...<|im_end|>``); ``<|im_end|>`` is the EOS.
- ``generation_config.json`` with ``temperature: 0``: vLLM takes it as the default sampling
  parameters, so a client that sets no temperature gets greedy, reproducible text.
- the ``lm_head`` rows of EOS, the other special tokens and the byte tokens that are not
  valid UTF-8 alone are zero, so their logits are 0 while the largest of the other ~1,900
  random logits is positive: greedy decoding never stops by itself (a request ends at
  ``max_tokens``, finish_reason ``length``) and every generated token streams as text. A
  test that wants a natural stop asks for it with ``logit_bias`` on the EOS id (written to
  ``tiny_model.json`` with the other facts).

Needs torch, transformers and tokenizers (the engine venv of ``make test-engines`` has them).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
from pathlib import Path

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<pad>"]
EOS = "<|im_end|>"
POSITIONS = 2048
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Modules present in every CPython 3.11 build; their docstrings are the training text.
CORPUS_MODULES = [
    "abc", "argparse", "ast", "base64", "bisect", "calendar", "collections", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email",
    "enum", "fnmatch", "fractions", "functools", "gettext", "glob", "gzip", "hashlib", "heapq",
    "hmac", "html", "http.client", "inspect", "io", "ipaddress", "itertools", "json", "logging",
    "mailbox", "numbers", "operator", "optparse", "os", "pathlib", "pickle", "pprint",
    "queue", "random", "re", "sched", "secrets", "shlex", "shutil", "socket", "statistics",
    "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "timeit", "typing",
    "unittest", "urllib.parse", "uuid", "warnings", "wave", "weakref", "zipfile",
]


def corpus_lines() -> list[str]:
    """Docstrings of CORPUS_MODULES and their public members, in a fixed order."""
    lines: list[str] = []
    for name in CORPUS_MODULES:
        module = importlib.import_module(name)
        docs = [inspect.getdoc(module) or ""]
        for attr in sorted(vars(module)):
            obj = getattr(module, attr)
            if not attr.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj)):
                docs.append(inspect.getdoc(obj) or "")
        lines += [line.strip() for doc in docs for line in doc.splitlines() if line.strip()]
    return lines


def train_tokenizer(vocab_size: int):  # -> transformers tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token=EOS, unk_token="<unk>",
        pad_token="<pad>", chat_template=CHAT_TEMPLATE, model_max_length=POSITIONS)


def build_model(tokenizer, seed: int):  # -> LlamaForCausalLM
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        max_position_embeddings=POSITIONS, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=eos_id,
        pad_token_id=tokenizer.pad_token_id, torch_dtype="float32")
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():  # greedy decoding never picks these (module docstring)
        model.lm_head.weight[muted_token_ids(tokenizer)] = 0.0
    return model


def muted_token_ids(tokenizer) -> list[int]:
    """EOS, the other special tokens, and every token that is not valid UTF-8 on its own
    (a lone byte of a multi-byte character): streaming detokenizers hold such bytes back, so
    a model that emits them streams empty deltas."""
    muted = []
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        if token_id in tokenizer.all_special_ids or "\ufffd" in text or not text:
            muted.append(token_id)
    return muted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output directory (created)")
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    tokenizer = train_tokenizer(args.vocab_size)
    model = build_model(tokenizer, args.seed)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    generation = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": eos_id,
                  "pad_token_id": tokenizer.pad_token_id, "do_sample": False,
                  "temperature": 0.0}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    facts = {"eos_token_id": eos_id, "eos_token": EOS, "vocab_size": len(tokenizer),
             "muted_tokens": len(muted_token_ids(tokenizer)), "max_position_embeddings": POSITIONS,
             "seed": args.seed, "parameters": sum(p.numel() for p in model.parameters())}
    (out / "tiny_model.json").write_text(json.dumps(facts, indent=2) + "\n")
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"tiny model in {out}: {facts['parameters']:,} parameters, vocab {len(tokenizer)}, "
          f"{size / 1e6:.1f} MB on disk", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
