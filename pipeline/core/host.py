"""The machine a figure was measured on, in a few words a record can keep and a card can print.

Timings taken here hold for this host only: a card that shows them names it, so nobody reads a
conversion time or a check on this x86 server as a figure measured on a phone or a board.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def describe_host() -> dict[str, Any]:
    """{"cpu": model name, "cpus": logical CPUs, "system": OS and architecture, "python": version}."""
    return {
        "cpu": _cpu_model() or platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "system": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
    }


def host_line(host: dict[str, Any]) -> str:
    """One line for a person, e.g. "AMD EPYC 9454 (2 CPUs), Linux 6.8 x86_64"; "" for an empty record."""
    if not host:
        return ""
    cpus = f" ({host['cpus']} CPUs)" if host.get("cpus") else ""
    system = f", {host['system']}" if host.get("system") else ""
    return f"{host.get('cpu') or 'unknown CPU'}{cpus}{system}"


def _cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (Linux); None elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Hardware", "Model") and value.strip():
            return " ".join(value.split())
    return None
