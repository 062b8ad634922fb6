"""Process facts from Linux /proc, for tests and tools (standard library
only: no tnet, no TensorFlow, so any process can import it).

- `status_bytes(field, pid)`: a memory field of /proc/<pid>/status
  ("VmRSS", "VmHWM", ...) in bytes, or None if the process is gone.
- `reset_peak()`: resets this process's VmHWM to its current RSS (writes 5
  to /proc/self/clear_refs, Linux >= 4.0); False if not allowed.
- `cpu_seconds(pid)`: user + system CPU seconds (threads included).
- `running(pid)`: True unless the process is gone or a zombie.
"""
from __future__ import annotations

import os
from typing import Optional, Union

Pid = Union[int, str]


def status_bytes(field: str, pid: Pid = "self") -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _stat_fields(pid: Pid) -> Optional[list]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def cpu_seconds(pid: Pid) -> Optional[float]:
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 13:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def running(pid: Pid) -> bool:
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] not in ("Z", "X")
