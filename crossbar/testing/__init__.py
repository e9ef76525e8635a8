"""Test doubles for crossbar and for programs that use it, published the way
``treq.testing`` is: a simulated ``llama-server`` that answers as a real one does and can be
told to misbehave, a crossbar running in-process in front of such hosts, and crossbar's
proxy in memory against hosts the test plays byte by byte (:class:`MemoryProxy`).

Importing this package installs no reactor: the helpers use the global one when called.
"""

from crossbar.testing.logs import LogCapture
from crossbar.testing.memory import ClientLine, HostLine, LineTransport, MemoryProxy
from crossbar.testing.reader import Reader, broken
from crossbar.testing.rig import (
    FAST,
    Rig,
    RigMaker,
    all_polled,
    build,
    fast,
    rigs,
    teardown,
    wait_state,
)
from crossbar.testing.simulator import (
    BUILD_INFO,
    CacheState,
    Fault,
    Prefill,
    RecordedRequest,
    SimulatedHost,
)
from crossbar.testing.timeouts import eventually, guard, turns

__all__ = [
    "BUILD_INFO",
    "FAST",
    "CacheState",
    "ClientLine",
    "Fault",
    "HostLine",
    "LineTransport",
    "LogCapture",
    "MemoryProxy",
    "Prefill",
    "Reader",
    "RecordedRequest",
    "Rig",
    "RigMaker",
    "SimulatedHost",
    "all_polled",
    "broken",
    "build",
    "eventually",
    "fast",
    "guard",
    "rigs",
    "teardown",
    "turns",
    "wait_state",
]
