#!/usr/bin/env python3
"""Write tiny random-weight GGUF models that a real llama-server loads and runs.

    python scripts/tiny_models.py OUTDIR tiny-a tiny-b ...

writes ``OUTDIR/tiny-a.gguf``, ``OUTDIR/tiny-b.gguf``, ... (about 0.5 MB each). In llama-server's
router mode (``--models-dir OUTDIR``) the model ids are the file names without ``.gguf``.

Each model is a llama-architecture transformer (2 layers, 64 wide, 4 heads, context 2048, F32)
with random weights seeded by its name, so the same name always gives the same file and the same
output for the same request and seed. The tokenizer is SentencePiece-style ("llama"): ``<unk>``,
``<s>`` (BOS), ``</s>`` (EOS), byte-fallback tokens ``<0x00>``..``<0xFF>``, the ChatML markers
``<|im_start|>`` and ``<|im_end|>`` (EOT), and a few ordinary pieces. A ChatML chat template is
included, so ``/v1/chat/completions`` works.

The text it generates is meaningless, but readable: one channel of the hidden state is held
constant and the output rows of the special tokens and of non-ASCII / control bytes are pointed
against it, so sampling only ever picks printable ASCII bytes and ordinary pieces. Every generated
token is therefore valid UTF-8 (one streamed chunk per token), and generation never stops by
itself: ``finish_reason`` is ``"length"`` after ``max_tokens``.

Needs the ``gguf`` package at the version vendored in llama.cpp 0c1e57098 (``pip install
gguf==0.19.0``), which pulls in numpy.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - depends on the environment
    sys.exit("tiny_models.py needs the gguf package: pip install gguf==0.19.0")

N_LAYER = 2
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 4
N_FF = 128
N_CTX = 2048
RMS_EPS = 1e-5
ROPE_BASE = 10000.0

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Ordinary SentencePiece pieces ("\u2581" stands for a space). Scores favour longer pieces.
PIECES = [
    "\u2581",
    "\u2581the",
    "\u2581a",
    "\u2581and",
    "\u2581of",
    "\u2581to",
    "\u2581is",
    "\u2581in",
    "\u2581it",
    "\u2581hello",
    "\u2581Hello",
    "\u2581world",
    "\u2581cross",
    "bar",
    "\u2581model",
    "\u2581tiny",
    "ing",
    "ed",
    "er",
    "es",
    "th",
    "he",
    "an",
    "in",
    ".",
    ",",
    "!",
    "?",
]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def build_vocab() -> tuple[list[str], list[float], list[int], dict[str, int], list[int]]:
    """Return tokens, scores, token types, the ids of named specials, and the ids never sampled."""
    tt = gguf.TokenType
    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []
    banned: list[int] = []

    def add(text: str, score: float, kind: Any, ban: bool) -> int:
        tokens.append(text)
        scores.append(score)
        types.append(int(kind))
        if ban:
            banned.append(len(tokens) - 1)
        return len(tokens) - 1

    ids = {
        "unk": add("<unk>", 0.0, tt.UNKNOWN, True),
        "bos": add("<s>", 0.0, tt.CONTROL, True),
        "eos": add("</s>", 0.0, tt.CONTROL, True),
    }
    for byte in range(256):
        printable = 0x20 <= byte <= 0x7E
        add(f"<0x{byte:02X}>", 0.0, tt.BYTE, not printable)
    ids["im_start"] = add("<|im_start|>", 0.0, tt.CONTROL, True)
    ids["im_end"] = add("<|im_end|>", 0.0, tt.CONTROL, True)
    for rank, piece in enumerate(PIECES):
        add(piece, -float(rank + 1), tt.NORMAL, False)
    return tokens, scores, types, ids, banned


def _rng_for(name: str) -> np.random.Generator:
    seed = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")
    return np.random.default_rng(seed)


def _weights(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def write_tiny_model(path: Path, name: str) -> None:
    """Write one tiny model to ``path`` (atomically: a temporary file renamed into place)."""
    tokens, scores, types, ids, banned = build_vocab()
    n_vocab = len(tokens)
    head_dim = N_EMBD // N_HEAD
    n_embd_kv = head_dim * N_HEAD_KV
    rng = _rng_for(name)

    # Channel 0 of the residual stream is a constant "bias" channel: every token embedding has
    # 4.0 there and the blocks add only small values to it, so after the final RMS norm it is
    # large and positive. Output rows of banned tokens have a large negative weight on it, which
    # keeps their logits far below the others whatever the context.
    token_embd = _weights(rng, (n_vocab, N_EMBD), 1.0)
    token_embd[:, 0] = 4.0
    output = _weights(rng, (n_vocab, N_EMBD), 0.5)
    output[:, 0] = 0.0
    output[banned, 0] = -20.0

    tensors: list[tuple[str, np.ndarray]] = [
        ("token_embd.weight", token_embd),
        ("output_norm.weight", np.ones(N_EMBD, dtype=np.float32)),
        ("output.weight", output),
    ]
    for layer in range(N_LAYER):
        blk = f"blk.{layer}"
        tensors += [
            (f"{blk}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32)),
            (f"{blk}.attn_q.weight", _weights(rng, (N_EMBD, N_EMBD), 0.1)),
            (f"{blk}.attn_k.weight", _weights(rng, (n_embd_kv, N_EMBD), 0.1)),
            (f"{blk}.attn_v.weight", _weights(rng, (n_embd_kv, N_EMBD), 0.1)),
            (f"{blk}.attn_output.weight", _weights(rng, (N_EMBD, N_EMBD), 0.02)),
            (f"{blk}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32)),
            (f"{blk}.ffn_gate.weight", _weights(rng, (N_FF, N_EMBD), 0.1)),
            (f"{blk}.ffn_up.weight", _weights(rng, (N_FF, N_EMBD), 0.1)),
            (f"{blk}.ffn_down.weight", _weights(rng, (N_EMBD, N_FF), 0.02)),
        ]

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".gguf.tmp", dir=path.parent)
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp_name, "llama")
        writer.add_name(name)
        writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
        writer.add_context_length(N_CTX)
        writer.add_embedding_length(N_EMBD)
        writer.add_block_count(N_LAYER)
        writer.add_feed_forward_length(N_FF)
        writer.add_head_count(N_HEAD)
        writer.add_head_count_kv(N_HEAD_KV)
        writer.add_layer_norm_rms_eps(RMS_EPS)
        writer.add_rope_dimension_count(head_dim)
        writer.add_rope_freq_base(ROPE_BASE)
        writer.add_vocab_size(n_vocab)

        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_unk_token_id(ids["unk"])
        writer.add_bos_token_id(ids["bos"])
        writer.add_eos_token_id(ids["eos"])
        writer.add_eot_token_id(ids["im_end"])
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
        writer.add_chat_template(CHATML_TEMPLATE)

        for tensor_name, data in tensors:
            writer.add_tensor(tensor_name, data)

        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_name, 0o666 & ~umask)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write tiny random-weight GGUF models (OUTDIR/NAME.gguf) for llama-server."
    )
    parser.add_argument("outdir", type=Path, help="folder to write the models into")
    parser.add_argument("names", nargs="+", help="model names; each becomes NAME.gguf")
    args = parser.parse_args(argv)

    for name in args.names:
        if not _NAME_RE.match(name):
            parser.error(f"invalid model name {name!r}: use letters, digits, '.', '_' and '-'")
    for name in args.names:
        path = args.outdir / f"{name}.gguf"
        write_tiny_model(path, name)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
