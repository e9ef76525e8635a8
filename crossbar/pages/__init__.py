"""crossbar's own pages under ``/_crossbar/``: a thin Klein app over the health
table, with HTML for people and JSON and Prometheus metrics for machines."""

from crossbar.pages.app import StatusApp
from crossbar.pages.models import ModelEvents
from crossbar.pages.peers import WorkerInfo, gather_metrics, peer_secret, publish_port, read_port

__all__ = [
    "ModelEvents",
    "StatusApp",
    "WorkerInfo",
    "gather_metrics",
    "peer_secret",
    "publish_port",
    "read_port",
]
