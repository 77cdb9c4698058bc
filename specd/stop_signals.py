"""SIGTERM and SIGINT in every specd process: a handler only records that a stop was asked for.

A Python signal handler runs on the main thread between two bytecodes, possibly while that thread holds
a lock (inside `threading.Event.wait`, say): a handler that takes a lock can wait on itself for good
(issue 16: `specd up` calling `Event.set` from its handler). So no handler here takes a lock or does
work. `install()` (first thing in every `specd` command) makes both signals append to a list, so a stop
asked for while a process starts up is not lost; `caught()` hands them to a running asyncio loop,
whose own handler only wakes the loop, and the callback then runs as an ordinary loop callback.
"""
from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
from collections.abc import AsyncIterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_PR_SET_PDEATHSIG = 1
_received: list[int] = []  # list.append takes no lock


def install() -> None:
    """From now on SIGTERM / SIGINT only record themselves (read with `requested()`)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _record)


def _record(signum: int, _frame) -> None:
    _received.append(signum)


def requested() -> bool:
    """Whether a stop signal has arrived since `install()` (or inside `caught()`)."""
    return bool(_received)


@contextlib.asynccontextmanager
async def caught() -> AsyncIterator[asyncio.Event]:
    """An event set by SIGTERM / SIGINT (at once if one came earlier) while the block runs on this loop.

    On leaving, the handlers in place before (those of `install()`, or the defaults) come back, so a
    second signal during the rest of the shutdown is recorded, not fatal."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}

    def on_signal(signum: int) -> None:
        _received.append(signum)
        stop.set()

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    if requested():
        stop.set()
    try:
        yield stop
    finally:
        # Blocked while they are swapped: asyncio's removal sets the default action (death) for a moment.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            for signum in STOP_SIGNALS:
                loop.remove_signal_handler(signum)
                signal.signal(signum, previous[signum] or signal.SIG_DFL)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def die_with_parent(signum: int, parent_pid: int | None = None) -> None:
    """This process gets `signum` when its parent dies (Linux; elsewhere a no-op), so a crashed supervisor leaves
    no service behind. With `parent_pid`, a parent already gone by now ends this process at once."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signum)
    except OSError:  # not Linux: the supervisor's own shutdown path still stops its children
        return
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def ignore() -> None:
    """Once the process has stopped: further stop signals have nothing left to stop. (Python's shutdown resets
    handlers it installed to the default action, which would end a cleanly stopped process with -SIGTERM.)"""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
