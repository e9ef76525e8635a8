"""Test doubles for crossbar and for programs that use it, published the way
``treq.testing`` is: a simulated ``llama-server`` that answers as a real one does,
and can be told to misbehave."""

from crossbar.testing.simulator import BUILD_INFO, Fault, RecordedRequest, SimulatedHost

__all__ = ["BUILD_INFO", "Fault", "RecordedRequest", "SimulatedHost"]
