"""twistd plugin: ``twistd -n crossbar --config crossbar.yaml``.

Kept tiny on purpose: twistd imports every plugin file to list them, so the real
work is imported lazily from ``crossbar.tap`` only when crossbar is started.
"""

from twisted.application.service import ServiceMaker

crossbar = ServiceMaker(
    "crossbar",
    "crossbar.tap",
    "Model-aware streaming routing proxy for llama-server hosts",
    "crossbar",
)
