"""What a llama-server says, byte for byte: its JSON bodies and error shapes.

Pure data, no Twisted: the shapes are what crossbar parses and what tests compare with the
real server, so they are kept apart from how they are sent.  Completions (what a model
generates, and its SSE events) are in ``completions``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, Protocol

# llama-server's build number and short commit, as it reports them in "system_fingerprint" and
# "build_info" (llama.cpp 0c1e57098 built from the llama-cpp-python 0.3.36 sdist says this).
BUILD_INFO = "b1-0c1e570"
STATUSES = ("loaded", "loading", "unloaded")
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    501: "not_supported_error",
    503: "unavailable_error",
}

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
SLOTS: list[dict[str, object]] = [{"id": 0, "n_ctx": 4096, "is_processing": False}]
"""A model server's ``/slots`` before its first request (the simulator lists one slot)."""


class HttpError(Exception):
    """An answer in llama-server's error shape, raised from wherever the request fails;
    ``kind`` its ``type`` when not the status's own, ``extra`` fields after it."""

    def __init__(
        self, status: int, message: str, kind: str | None = None, extra: Any = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.extra: dict[str, Any] = dict(extra or {})

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.kind, self.extra)


def dumps(value: object) -> bytes:
    """Compact JSON, as llama-server writes it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def error_body(
    status: int, message: str, kind: str | None = None, extra: dict[str, Any] | None = None
) -> bytes:
    """llama-server's ``{"error": ...}``; the HTTP layer's own 404 orders its keys otherwise."""
    kind = kind or _ERROR_TYPES.get(status, "server_error")
    body = {"code": status, "message": message, "type": kind, **(extra or {})}
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


def router_models(
    models: Iterable[Listed], created: int, meta: Callable[[str], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A router's ``/v1/models``: every model with its status; ``meta`` for running ones
    (``meta(model)``, else :data:`META`)."""
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
            entry["meta"] = META if meta is None else meta(model.id)
        data.append(entry)
    return {"data": data, "object": "list"}


def single_models(name: str, created: int, meta: dict[str, Any] = META) -> dict[str, Any]:
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
                "meta": meta,
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


def model_props(name: str, slots: int, window: int = 4096, started: int = 0) -> dict[str, Any]:
    """One model's ``/props``: ``total_slots`` is its ``-np``, ``n_ctx`` a slot's window,
    ``media_marker`` random at each start of its server (here: ``started``, its port)."""
    return {
        "default_generation_settings": {"id": 0, "n_ctx": window, "params": {}},
        "total_slots": slots,
        "model_alias": name,
        "model_path": f"/m/{name}.gguf",
        "build_info": BUILD_INFO,
        "media_marker": f"<__media_{started}__>",
        "is_sleeping": False,
    }
