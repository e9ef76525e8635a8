"""What a llama-server says, byte for byte: its JSON bodies, SSE events and error shapes.

Pure data, no Twisted: the shapes are what crossbar parses and what tests compare with the
real server, so they are kept apart from how they are sent.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

# llama-server's build number and short commit, as it reports them in "system_fingerprint" and
# "build_info" (llama.cpp 0c1e57098 built from the llama-cpp-python 0.3.36 sdist says this).
BUILD_INFO = "b1-0c1e570"
MAX_TOKENS = 100_000
STATUSES = ("loaded", "loading", "unloaded")
COMPLETIONS = ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions")
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    501: "not_supported_error",
    503: "unavailable_error",
}
_ALPHABET = "abcdefghijklmnopqrstuvwxyz"
_ID_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_TOKEN_LIMITS = ("max_tokens", "max_completion_tokens", "n_predict")

META = {
    "vocab_type": 1,
    "n_vocab": 289,
    "n_ctx": 2048,
    "n_ctx_train": 2048,
    "n_embd": 64,
    "n_params": 119232,
    "size": 476928,
    "ftype": "all F32",
}
"""A running model's ``meta`` in ``/v1/models``: the tiny models of the integration tests."""

METRICS = (
    b"# HELP llamacpp:requests_processing Number of requests processing.\n"
    b"# TYPE llamacpp:requests_processing gauge\n"
    b"llamacpp:requests_processing 0\n"
)
SLOTS = [{"id": 0, "id_task": -1, "n_ctx": 4096, "is_processing": False}]


class HttpError(Exception):
    """An answer in llama-server's error shape, raised from wherever the request fails."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def dumps(value: object) -> bytes:
    """Compact JSON, as llama-server writes it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def text(start: int, size: int) -> str:
    """Deterministic generated text: ``size`` letters starting at offset ``start``."""
    offset = start % len(_ALPHABET)
    return (_ALPHABET * ((offset + size) // len(_ALPHABET) + 1))[offset : offset + size]


def error_body(status: int, message: str) -> bytes:
    """llama-server's ``{"error": ...}``; the HTTP layer's own 404 orders its keys otherwise."""
    kind = _ERROR_TYPES.get(status, "server_error")
    body = {"code": status, "message": message, "type": kind}
    if status == 404:
        body = {"message": message, "type": kind, "code": status}
    return dumps({"error": body})


def json_object(data: bytes) -> dict[str, Any]:
    """A request body as a JSON object; a parse error answers 500 like llama-server's."""
    try:
        body = json.loads(data)
    except ValueError as e:
        raise HttpError(500, f"[json.exception.parse_error.101] parse error: {e}") from None
    if not isinstance(body, dict):
        raise HttpError(400, "request body must be a JSON object")
    return body


# -- completions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """The OpenAI-shaped pieces of one generated answer of ``tokens`` tokens."""

    chat: bool
    model: str
    created: int
    tokens: int
    finish: str
    usage: dict[str, Any]
    timings: dict[str, float]
    # "chatcmpl-" for text completions too: llama-server says so.
    id: str = field(
        default_factory=lambda: "chatcmpl-" + "".join(secrets.choice(_ID_CHARS) for _ in range(32))
    )

    @classmethod
    def to(
        cls,
        body: Mapping[str, Any],
        *,
        chat: bool,
        model: str,
        created: int,
        chunks: int,
        pace: float,
    ) -> Reply:
        """The answer to a request ``body``: ``chunks`` tokens unless it sets a limit, with
        usage and timings as llama-server counts them (``pace`` seconds a token)."""
        n, finish = chunks, "stop"
        for key in _TOKEN_LIMITS:
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                n, finish = min(value, MAX_TOKENS), "length"
                break
        prompt = max(1, len(json.dumps(body.get("messages", body.get("prompt", ""))).split()))
        usage = {
            "completion_tokens": n,
            "prompt_tokens": prompt,
            "total_tokens": n + prompt,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        ms = max(pace, 0.001) * 1000
        timings = {
            "cache_n": 0,
            "prompt_n": prompt,
            "prompt_ms": 1.0,
            "prompt_per_token_ms": 1.0 / prompt,
            "prompt_per_second": 1000.0 * prompt,
            "predicted_n": n,
            "predicted_ms": n * ms,
            "predicted_per_token_ms": ms,
            "predicted_per_second": 1000 / ms,
        }
        return cls(chat, model, created, n, finish, usage, timings)

    def whole(self, size: int) -> dict[str, Any]:
        """The non-streamed answer, ``size`` letters a token."""
        content = text(0, self.tokens * size)
        if self.chat:
            message = {"role": "assistant", "content": content}
            choice = {"finish_reason": self.finish, "index": 0, "message": message}
        else:
            choice = {"text": content, "index": 0, "logprobs": None, "finish_reason": self.finish}
        return {
            "choices": [choice],
            "created": self.created,
            "model": self.model,
            "system_fingerprint": BUILD_INFO,
            "object": "chat.completion" if self.chat else "text_completion",
            "usage": self.usage,
            "id": self.id,
            "timings": self.timings,
        }

    def events(self, size: int, with_usage: bool) -> Iterator[tuple[bool, bytes]]:
        """(paced, bytes) for every SSE event, generated lazily: streams may be huge.

        Chat chunks carry the id before the model; text completion chunks after the object,
        and their last chunk always has the usage (``include_usage`` adds nothing). A chat
        stream's finish chunk has the timings, unless ``include_usage`` asked for one more
        chunk with the usage: then that one has them.
        """
        if self.chat:
            role = {"role": "assistant", "content": None}
            yield False, self._event([{"finish_reason": None, "index": 0, "delta": role}])
        for i in range(self.tokens):
            yield True, self._event([self._choice(None, text(i * size, size))])
        last = [self._choice(self.finish, None)]
        if not self.chat:
            yield False, self._event(last, usage=self.usage, timings=self.timings)
        elif with_usage:
            yield False, self._event(last)
            yield False, self._event([], usage=self.usage, timings=self.timings)
        else:
            yield False, self._event(last, timings=self.timings)
        yield False, b"data: [DONE]\n\n"

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        if self.chat:
            head = {"choices": choices, "created": self.created, "id": self.id}
            doc = head | {
                "model": self.model,
                "system_fingerprint": BUILD_INFO,
                "object": "chat.completion.chunk",
            }
        else:
            doc = {
                "choices": choices,
                "created": self.created,
                "model": self.model,
                "system_fingerprint": BUILD_INFO,
                "object": "text_completion",
            }
            usage = extra.pop("usage", None)
            if usage is not None:
                doc["usage"] = usage
            doc["id"] = self.id
        return b"data: " + dumps(doc | extra) + b"\n\n"

    def _choice(self, finish: str | None, content: str | None) -> dict[str, Any]:
        if not self.chat:
            return {"text": content or "", "index": 0, "logprobs": None, "finish_reason": finish}
        return {
            "finish_reason": finish,
            "index": 0,
            "delta": {} if content is None else {"content": content},
        }


# -- models and server info ---------------------------------------------------------------------


class Listed(Protocol):
    """What ``/v1/models`` tells of one model in router mode."""

    @property
    def id(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def failed(self) -> bool: ...


def router_models(models: Iterable[Listed], created: int) -> dict[str, Any]:
    """A router's ``/v1/models``: every model with its status; ``meta`` for running ones."""
    data = []
    for model in models:
        path = f"/m/{model.id}.gguf"
        args = ["llama-server", "--host", "127.0.0.1", "--port", str(model.port)]
        status: dict[str, Any] = {
            "value": model.status,
            "args": [*args, "--alias", model.id, "--model", path],
            "preset": f"[{model.id}]\nmodel = {path}\n\n",
        }
        if model.failed:
            status |= {"exit_code": 1, "failed": True}
        entry: dict[str, Any] = {
            "id": model.id,
            "aliases": [],
            "tags": [],
            "object": "model",
            "owned_by": "llamacpp",
            "created": created,
            "status": status,
            "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
            "source": "models_dir",
            "can_remove": False,
        }
        if model.status == "loaded":  # only a running model can tell its metadata
            entry["meta"] = META
        data.append(entry)
    return {"data": data, "object": "list"}


def single_models(name: str, created: int) -> dict[str, Any]:
    """A single-model server's ``/v1/models``: Ollama's shape and OpenAI's, no status."""
    return {
        "models": [
            {
                "name": name,
                "model": name,
                "modified_at": "",
                "size": "",
                "digest": "",
                "type": "model",
                "description": "",
                "tags": [""],
                "capabilities": ["completion"],
                "parameters": "",
                "details": {
                    "parent_model": "",
                    "format": "gguf",
                    "family": "",
                    "families": [""],
                    "parameter_size": "",
                    "quantization_level": "",
                },
            }
        ],
        "object": "list",
        "data": [
            {
                "id": name,
                "aliases": [name],
                "tags": [],
                "object": "model",
                "created": created,
                "owned_by": "llamacpp",
                "meta": META,
            }
        ],
    }


def router_props(models_max: int) -> dict[str, Any]:
    """A router's own ``/props`` (asked without ``?model=``)."""
    return {
        "role": "router",
        "max_instances": models_max,
        "models_autoload": True,
        "model_alias": "llama-server",
        "model_path": "none",
        "default_generation_settings": {"params": None, "n_ctx": 0},
        "ui_settings": {},
        "build_info": BUILD_INFO,
        "cors_proxy_enabled": False,
    }


def model_props(name: str) -> dict[str, Any]:
    """One model's ``/props``."""
    return {
        "default_generation_settings": {"id": 0, "n_ctx": 4096, "params": {}},
        "total_slots": 1,
        "model_alias": name,
        "model_path": f"/m/{name}.gguf",
        "build_info": BUILD_INFO,
        "is_sleeping": False,
    }
