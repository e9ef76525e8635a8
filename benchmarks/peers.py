"""Caddy and nginx beside crossbar in ``run.py``: the same upstream, the same load.

Each peer is set up as a plain streaming reverse proxy to the one upstream, with an access
log line per request written to a file, as crossbar writes one:

- **Caddy**: ``caddy run`` of a Caddyfile in the run's temp directory: ``reverse_proxy``
  with ``flush_interval -1``, an access log (JSON, Caddy's default for a file, never rolled),
  no admin endpoint, its state under the temp directory. ``GOMAXPROCS`` is left at its
  default (the number of cores), as a packaged Caddy runs.
- **nginx**: ``nginx -c <tmp>/nginx.conf -g 'daemon off;'`` with ``worker_processes 1`` (one
  process serves, as one crossbar does; its master is idle and counted too), an
  ``upstream`` block with ``keepalive 64``, ``proxy_http_version 1.1``, ``Connection ""``,
  ``proxy_buffering off``, the ``combined`` access log to a file, and every path (pid, temp
  files, logs) inside the temp directory, so it runs as root or not.

A peer that is not on ``PATH`` is left out with one line saying how to install it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

PEERS = ("caddy", "nginx")


def available(names: list[str]) -> list[str]:
    """The peers of ``names`` that are installed; one line for each that is not."""
    found = []
    for name in names:
        if shutil.which(name) is None:
            print(f"{name} not found: apt-get install {name}; its columns are left out", flush=True)
        else:
            found.append(name)
    return found


def version(name: str) -> str:
    """``caddy version`` or ``nginx -v`` (which writes to stderr), first line."""
    cmd = [name, "version"] if name == "caddy" else [name, "-v"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except OSError:
        return ""
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else ""


def caddy_config(workdir: Path, port: int, upstream: int) -> str:
    return (
        "{\n"
        "\tadmin off\n"
        "\tauto_https off\n"
        "}\n"
        f"http://127.0.0.1:{port} {{\n"
        "\tbind 127.0.0.1\n"
        "\tlog {\n"
        f"\t\toutput file {workdir / 'caddy-access.log'} {{\n"
        "\t\t\troll_disabled\n"
        "\t\t}\n"
        "\t}\n"
        f"\treverse_proxy 127.0.0.1:{upstream} {{\n"
        "\t\tflush_interval -1\n"
        "\t\ttransport http {\n"
        "\t\t\tkeepalive_idle_conns_per_host 64\n"
        "\t\t}\n"
        "\t}\n"
        "}\n"
    )


def nginx_config(workdir: Path, port: int, upstream: int) -> str:
    temp = workdir / "nginx-temp"
    # As root the worker would switch to "nobody", which cannot enter the private temp
    # directory; it stays root instead (loopback only). As another user "user" is ignored.
    user = "user root;\n" if os.geteuid() == 0 else ""
    return (
        f"{user}worker_processes 1;\n"
        "worker_rlimit_nofile 8192;\n"
        f"pid {workdir / 'nginx.pid'};\n"
        f"error_log {workdir / 'nginx-error.log'} warn;\n"
        "events { worker_connections 4096; }\n"
        "http {\n"
        f"  access_log {workdir / 'nginx-access.log'} combined;\n"
        f"  client_body_temp_path {temp / 'body'};\n"
        f"  proxy_temp_path {temp / 'proxy'};\n"
        f"  fastcgi_temp_path {temp / 'fastcgi'};\n"
        f"  uwsgi_temp_path {temp / 'uwsgi'};\n"
        f"  scgi_temp_path {temp / 'scgi'};\n"
        f"  upstream llama {{ server 127.0.0.1:{upstream}; keepalive 64; }}\n"
        "  server {\n"
        f"    listen 127.0.0.1:{port} backlog=1024;\n"
        "    location / {\n"
        "      proxy_pass http://llama;\n"
        "      proxy_http_version 1.1;\n"
        '      proxy_set_header Connection "";\n'
        "      proxy_buffering off;\n"
        "    }\n"
        "  }\n"
        "}\n"
    )


def start(name: str, workdir: Path, port: int, upstream: int) -> tuple[subprocess.Popen[Any], Path]:
    """Writes the peer's config into ``workdir`` and starts it in the foreground; returns
    the process and the file its own output goes to."""
    log = workdir / f"{name}.out"
    env = dict(os.environ)
    if name == "caddy":
        config = workdir / "Caddyfile"
        config.write_text(caddy_config(workdir, port, upstream))
        cmd = ["caddy", "run", "--config", str(config), "--adapter", "caddyfile"]
        # Caddy keeps its state under $HOME otherwise.
        env["XDG_DATA_HOME"] = env["XDG_CONFIG_HOME"] = str(workdir / "caddy-home")
    else:
        config = workdir / "nginx.conf"
        config.write_text(nginx_config(workdir, port, upstream))
        (workdir / "nginx-temp").mkdir(exist_ok=True)
        cmd = ["nginx", "-p", str(workdir), "-c", str(config), "-g", "daemon off;"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env=env)
    return proc, log


# ---------------------------------------------------------------------------- ratios


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def ratios(summary: dict[str, Any], crossbars: list[str], peers: list[str]) -> dict[str, Any]:
    """Each crossbar figure over the same figure of each peer, from the same run."""
    out: dict[str, Any] = {}
    wrk, streams = summary["wrk"], summary["streams"]
    for cb in crossbars:
        for peer in peers:
            row: dict[str, float | None] = {}
            if cb in wrk and peer in wrk:
                row["cpu_per_request"] = _ratio(
                    wrk[cb]["cpu_ms_per_request"], wrk[peer]["cpu_ms_per_request"]
                )
            for k, per_k in streams.items():
                if cb in per_k and peer in per_k and k != "1":
                    a, b = per_k[cb], per_k[peer]
                    row[f"cpu_per_chunk_{k}"] = _ratio(a["cpu_us_per_chunk"], b["cpu_us_per_chunk"])
            for k, per_k in streams.items():
                if cb in per_k and peer in per_k and k != "1":
                    a, b = per_k[cb], per_k[peer]
                    row[f"ttfc_p50_{k}"] = _ratio(a["ttfc_p50_ms"], b["ttfc_p50_ms"])
            rss = [_peak(summary, m) for m in (cb, peer)]
            row["peak_rss"] = _ratio(rss[0], rss[1])
            out.setdefault(cb, {})[peer] = row
    return out


def _peak(summary: dict[str, Any], mode: str) -> float | None:
    """The highest RSS the path's proxy reached in any workload."""
    parts = [summary["wrk"], *summary["streams"].values()]
    peaks = [part[mode]["peak_rss_kb"] for part in parts if mode in part]
    return max(peaks) if peaks else None


def _label(key: str) -> str:
    if key == "cpu_per_request":
        return "CPU/request"
    if key == "peak_rss":
        return "peak RSS"
    what, _, k = key.rpartition("_")
    k = f"{k.rstrip('s')} staggered" if k.endswith("s") else k
    return f"CPU/chunk K={k}" if what == "cpu_per_chunk" else f"TTFC p50 K={k}"


def print_ratios(table: dict[str, Any], labels: dict[str, str]) -> None:
    """The third table: crossbar as a ratio of Caddy and nginx (1.00: the same; lower: less)."""
    rows = [(cb, peer, row) for cb, per_peer in table.items() for peer, row in per_peer.items()]
    if not rows:
        return
    keys = list(rows[0][2])
    print("crossbar as a ratio of Caddy and nginx (same run; below 1: crossbar uses less)")
    print()
    print("| crossbar | ÷ | " + " | ".join(_label(k) for k in keys) + " |")
    print("|---|---|" + "--:|" * len(keys))
    for cb, peer, row in rows:
        cells = ["-" if row.get(k) is None else f"{row[k]:.2f}" for k in keys]
        print(f"| {labels.get(cb, cb)} | {peer} | " + " | ".join(cells) + " |")
    print()
