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
model stays listed as ``loaded`` until its process has exited (``unload_time``). A router
answers ``GET /props`` with its ``max_instances`` (``models_max``); loading past it evicts the
least recently used *idle* model, and while every loaded model is busy a request for another
waits until one is idle (llama.cpp since PR 26572); ``loads`` and ``evictions`` count them.

An answer ends by itself, as a model's does when it samples its end token: ``"stop"`` after
8 to 60 tokens, the same for the same model, prompt and ``seed`` (or temperature 0), drawn
afresh without one.  A limit (``n_predict``, else ``max_completion_tokens``, else ``max_tokens``,
read in that order on every completion endpoint) only cuts it shorter, with ``"length"``;
tests that count tokens fix the length with ``chunks``.  ``usage`` and ``timings`` count
what was sent: ``completion_tokens`` and ``predicted_n`` are the content tokens,
``predicted_ms`` their pace.

Asked by an agent to create a file (``hello.py``), with a tool offered that writes files or
runs commands, it answers with the call that writes it, and ends the turn after the tool's
result (``toolcalls``); so an agent can be tried end to end against ``crossbar --demo``.

Besides chat and text completions it speaks Anthropic's Messages API (``/v1/messages``, what
Claude Code sends) and OpenAI's Responses API (``/v1/responses``, what Codex sends), and counts
prompt tokens for both (``/v1/messages/count_tokens``, ``/v1/responses/input_tokens``,
``/v1/chat/completions/input_tokens``), with the real server's event names, usage and errors
(see ``apis``).  A request that forces a tool (Anthropic's ``tool_choice`` ``tool`` or ``any``,
Responses' ``function`` or ``"required"``) is answered with a call of it.

Every model server keeps a prompt cache as llama-server does (``cache``): ``slots`` slots
holding the last prompt and answer of each, a host-memory cache of ``cache_ram`` tokens, the
same choice of slot; ``timings.cache_n`` counts the prompt tokens found there, ``prompt_n``
the others, which take ``prefill_time`` each.  A request waits while every slot is busy.

What it does not copy: the real router sometimes puts several SSE events into one HTTP chunk
(the simulator writes one chat event per chunk, and a Messages or Responses stream's events
of one token together, as llama-server does), and its tokens are not a tokenizer's.
"""

from crossbar.testing.simulator.cache import CacheState, Prefill
from crossbar.testing.simulator.host import SimulatedHost
from crossbar.testing.simulator.recorded import Fault, RecordedRequest
from crossbar.testing.simulator.replies import BUILD_INFO

__all__ = ["BUILD_INFO", "CacheState", "Fault", "Prefill", "RecordedRequest", "SimulatedHost"]
