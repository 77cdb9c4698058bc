"""The interpreter's thread switch interval every specd process runs under.

A thread that wants the interpreter's lock while another runs Python waits until the holder blocks or until the
switch interval passes (CPython's default: 5 ms). Every specd process has one busy thread beside threads that only
hand messages on: the engine thread beside the pipe thread that takes in new requests, the serving process's event
loop beside the thread reading the engine's step messages, a gateway's event loop beside the worker thread that
tokenizes. Under load each such hand-off waited for the busy thread's interval, several times on a request's way
to its first token. 0.5 ms lets a hand-off through ten times sooner; a thread that nobody waits for is never
interrupted, so a lone busy thread pays nothing. SPECD_SWITCH_INTERVAL_S overrides it (0.005: CPython's).
"""
from __future__ import annotations

import sys

from specd import environment

SWITCH_INTERVAL_S = 0.0005


def apply_switch_interval() -> None:
    """Sets this process's switch interval (each process's own: call it first thing in every process specd starts)."""
    value = environment.switch_interval_s()
    try:
        interval = float(value) if value is not None else SWITCH_INTERVAL_S
    except ValueError:
        interval = float("nan")
    if not 0 < interval < 1:
        raise ValueError(f"{environment.SWITCH_INTERVAL_S}: must be a number of seconds in (0, 1), got {value!r}")
    sys.setswitchinterval(interval)
