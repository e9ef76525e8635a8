"""What ``run.py`` reads from ``/proc``: a process tree, its CPU time and its memory.

CPU comes from ``/proc/<pid>/stat`` (utime + stime) and, finer, each thread's
``schedstat``; memory and thread counts from ``/proc/<pid>/status``. Linux only.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """The process and its descendants (crossbar's ``workers: N`` are its children)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def cpu_ticks(pids: list[int]) -> int:
    """utime + stime of the processes (all their threads), in clock ticks."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])
    return total


def cpu_ns(pids: list[int]) -> int:
    """On-CPU time of every thread from ``schedstat``, in ns: a finer cross-check."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
    return total


def status_kb(pids: list[int], key: str) -> int:
    """A ``/proc/<pid>/status`` figure (VmRSS, VmHWM, Threads), summed over the processes."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    total += int(line.split()[1])
                    break
    return total


def threads(pids: list[int]) -> int:
    return status_kb(pids, "Threads")


class RssSampler(threading.Thread):
    """Samples VmRSS every ``period`` seconds; ``take_peak`` returns and resets the peak."""

    def __init__(self, pids: list[int], period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.period = period
        self.peak_kb = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.peak_kb = max(self.peak_kb, status_kb(self.pids, "VmRSS"))
            time.sleep(self.period)

    def take_peak(self) -> int:
        peak, self.peak_kb = self.peak_kb, 0
        return max(peak, status_kb(self.pids, "VmRSS"))
