"""Counters inside a crossbar under benchmark (``run.py --probe``).

``run.py`` puts this directory on the crossbar process's ``PYTHONPATH`` and names a
file in ``CROSSBAR_BENCH_PROBE``; Python imports this module at start-up, before
Twisted binds ``socket.getaddrinfo``. At exit it writes to that file:

- ``getaddrinfo``: calls by host, and whether they ran on the reactor's thread
  (``main``) or in the thread pool (``pool``);
- ``gc``: collections by generation and the CPU seconds they took.

``CROSSBAR_BENCH_GC_TUNE`` tries garbage collector settings without changing crossbar:
``freeze`` calls ``gc.freeze()`` 3 s after start (start-up objects are then never
scanned again); ``threshold=N`` sets the youngest generation's threshold to N.
"""

from __future__ import annotations

import atexit
import collections
import gc
import json
import os
import socket
import threading
import time

_path = os.environ.get("CROSSBAR_BENCH_PROBE")
if _path:
    _calls: collections.Counter[str] = collections.Counter()
    _real = socket.getaddrinfo

    def _counting(host, *args, **kwargs):  # type: ignore[no-untyped-def]
        where = "main" if threading.current_thread() is threading.main_thread() else "pool"
        _calls[f"{host}|{where}"] += 1
        return _real(host, *args, **kwargs)

    socket.getaddrinfo = _counting

    _gc = {"collections": [0, 0, 0], "seconds": [0.0, 0.0, 0.0]}
    _gc_started = [0.0]

    def _gc_timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            _gc_started[0] = time.thread_time()
        else:
            generation = info["generation"]
            _gc["collections"][generation] += 1
            _gc["seconds"][generation] += time.thread_time() - _gc_started[0]

    gc.callbacks.append(_gc_timer)

    for _knob in filter(None, os.environ.get("CROSSBAR_BENCH_GC_TUNE", "").split(",")):
        if _knob == "freeze":
            threading.Timer(3.0, gc.freeze).start()
        elif _knob.startswith("threshold="):
            _, g1, g2 = gc.get_threshold()
            gc.set_threshold(int(_knob.partition("=")[2]), g1, g2)

    @atexit.register
    def _dump() -> None:
        with open(_path, "w") as f:
            json.dump(
                {
                    "getaddrinfo": dict(_calls),
                    "gc": _gc,
                    "process_cpu_seconds": time.process_time(),
                },
                f,
            )
