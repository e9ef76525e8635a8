"""A simulated llama-server, so crossbar can be tested without models or GPUs.

It answers the way a real ``llama-server`` does (router mode by default, or single-model
mode): the same status codes, JSON shapes, error shapes, headers and SSE framing.  On top of
that it records every request and can be told to misbehave (``fault``), so tests can prove
how crossbar reacts to slow, broken or vanishing hosts.  Run it by hand with
``python -m crossbar.testing.simulator --listen 8081 --models tiny-a=loaded,tiny-b=unloaded``.

It follows llama.cpp 0c1e57098 as observed (``tests/integration`` runs crossbar against that
real server): a router's own answers carry ``Keep-Alive: timeout=5, max=100`` and a length,
every error closes the connection, the completions it relays come chunked with
``Connection: close``, ``/v1/models`` gives ``meta`` for loaded models only, and an unloaded
model stays listed as ``loaded`` until its process has exited (``unload_time``). What it does
not copy: the real router sometimes puts several SSE events into one HTTP chunk (the
simulator writes one event per chunk), and its token counts are not a tokenizer's.
"""

from crossbar.testing.simulator.host import Fault, RecordedRequest, SimulatedHost
from crossbar.testing.simulator.replies import BUILD_INFO

__all__ = ["BUILD_INFO", "Fault", "RecordedRequest", "SimulatedHost"]
