"""The environment a test gives ``twistd``: a key the configs name, and this checkout's
``twisted/plugins`` on the path (an editable install's twistd does not find it)."""

from __future__ import annotations

import os

from tests.support import REPO

ENV = dict(
    os.environ,
    LAB_KEY="lab-secret-9",
    PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
)
