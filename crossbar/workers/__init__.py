"""Worker processes: worker 0 (twistd) starts and watches workers 1..N-1."""

from crossbar.workers.supervisor import WorkerProcesses

__all__ = ["WorkerProcesses"]
