"""A server that says one name and hangs up: which listener answered is in its words."""

from __future__ import annotations

from twisted.internet.interfaces import IAddress
from twisted.internet.protocol import Protocol, ServerFactory


class Greet(Protocol):
    """Says a name and hangs up."""

    def __init__(self, name: bytes) -> None:
        self.name = name

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(self.name)
        self.transport.loseConnection()


class Greeter(ServerFactory):
    """Serves Greet with one name."""

    def __init__(self, name: bytes) -> None:
        self.name = name

    def buildProtocol(self, addr: IAddress | None) -> Protocol:
        return Greet(self.name)
