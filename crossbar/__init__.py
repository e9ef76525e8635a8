"""crossbar: a model-aware, streaming routing proxy for llama-server hosts."""

__version__ = "0.1.0"
