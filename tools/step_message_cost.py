"""The CPU one engine step's outputs cost on the engine process's pipe (verifier_service/step_message.py): the engine
thread's pickling of the step message, and the serving process's unpickling, as a list of RequestOutput dataclasses
and as columns, in turns.

    PYTHONPATH=. python tools/step_message_cost.py        env: REQUESTS=256 ROUNDS=5

BENCHMARKS.md round 28 has the table of the development machine.
"""
from __future__ import annotations

import os
import statistics
import time
from multiprocessing.reduction import ForkingPickler

from verifier_service.engine.outputs import EngineLoad, RequestOutput, RequestUsage
from verifier_service.step_message import pack, unpack

REQUESTS, ROUNDS = int(os.environ.get("REQUESTS", "256")), int(os.environ.get("ROUNDS", "5"))
CALLS = 200


def per_call(fn) -> float:
    began = time.perf_counter()
    for _ in range(CALLS):
        fn()
    return (time.perf_counter() - began) / CALLS * 1e6


def main() -> None:
    outputs = [RequestOutput(f"{i:032x}", [1000 + i], None, RequestUsage(300, 40, 0, 0, 40, 4)) for i in range(REQUESTS)]
    load = EngineLoad(REQUESTS, 0, 500, 4000)
    as_objects = ForkingPickler.dumps(("step", outputs, [], load, 9, 0))
    as_columns = ForkingPickler.dumps(("step", pack(outputs), [], load, 9, 0))
    rows = {"objects": ([], []), "columns": ([], [])}
    for _ in range(ROUNDS):
        rows["objects"][0].append(per_call(lambda: ForkingPickler.dumps(("step", outputs, [], load, 9, 0))))
        rows["columns"][0].append(per_call(lambda: ForkingPickler.dumps(("step", pack(outputs), [], load, 9, 0))))
        rows["objects"][1].append(per_call(lambda: ForkingPickler.loads(as_objects)))
        rows["columns"][1].append(per_call(lambda: unpack(ForkingPickler.loads(as_columns)[1])))
    print(f"\n{REQUESTS} outputs a step, {ROUNDS} rounds in turns, medians (each round)")
    print("| step message | bytes | engine thread: pickle, us | serving process: unpickle (and rebuild), us |")
    print("|---|---|---|---|")
    for name, size in (("objects", len(as_objects)), ("columns", len(as_columns))):
        sent, received = rows[name]
        print(f"| {name} | {size:,} | {statistics.median(sent):.0f} ({', '.join(f'{v:.0f}' for v in sent)}) | "
              f"{statistics.median(received):.0f} ({', '.join(f'{v:.0f}' for v in received)}) |")


if __name__ == "__main__":
    main()
