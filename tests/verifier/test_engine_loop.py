"""The engine loop's thread (verifier_service/engine_loop.py): an abort wins whatever the order, and stop()
returns wherever it lands, mid-generation included (issue 17, items 1 and 2)."""
import asyncio
import threading

from specd.sampling import SamplingParams
from support.fake_runner import FakePagedRunner
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine
from verifier_service.engine_loop import EngineLoop

LONG = SamplingParams(max_tokens=1000, ignore_eos=True)


def engine_loop() -> EngineLoop:
    runner = FakePagedRunner(num_blocks=300, block_size=4, vocab_size=32, max_model_len=1024)
    return EngineLoop(Engine(EngineConfig(num_speculative_tokens=0), runner=runner))


async def test_a_request_aborted_before_the_thread_took_it_never_reaches_the_engine():
    loop = engine_loop()
    loop.add("early", [1, 2, 3], LONG)  # the thread is not started: the addition is still queued
    loop.abort("early")
    loop.start()
    try:
        follower = loop.add("follower", [4, 5], SamplingParams(max_tokens=2))
        while not (await follower.get())[-1].finished:  # the thread has applied everything queued before it
            pass
        assert not loop.engine.has_unfinished_requests()
        assert loop.load.num_used_blocks == 0
    finally:
        loop.stop()


async def test_stop_returns_while_a_request_is_generating():
    for _ in range(20):
        loop = engine_loop()
        loop.start()
        outputs = loop.add("long", [1, 2, 3], LONG)
        await outputs.get()  # generating: the thread is inside its step loop
        stopper = threading.Thread(target=loop.stop, daemon=True)
        stopper.start()
        await asyncio.to_thread(stopper.join, 5.0)
        assert not stopper.is_alive(), "EngineLoop.stop() did not return"


class GatedRunner(FakePagedRunner):
    """Runs one forward per `permit` released (`open()`: all from now on); `entered` counts the forwards begun,
    `forwards` records which requests each ran."""

    def __init__(self) -> None:
        super().__init__(num_blocks=300, block_size=4, vocab_size=32, max_model_len=1024)
        self.permit, self.entered = threading.Semaphore(0), threading.Semaphore(0)
        self.forwards: list[list[str]] = []

    def open(self) -> None:
        self.permit.release(1_000)

    def execute(self, batch):
        self.forwards.append([r.request_id for r in batch.requests])
        self.entered.release()
        self.permit.acquire(timeout=10)
        return super().execute(batch)


async def test_an_abort_during_a_step_frees_the_request_at_once_and_keeps_it_out_of_the_step_behind():
    """On the CPU a step takes seconds (a 2,048-token chunk on two cores) and an asynchronous step launches
    the next one before it returns: an abort that waited for the step to end kept a cancelled request
    computing for both."""
    runner = GatedRunner()
    loop = EngineLoop(Engine(EngineConfig(num_speculative_tokens=0, async_scheduling=True), runner=runner))
    loop.start()
    try:
        loop.add("cancelled", [1, 2, 3], LONG)
        assert await asyncio.to_thread(runner.entered.acquire, timeout=5)  # the thread is inside the request's forward
        loop.abort("cancelled")
        for load in (loop.engine.load(), loop.load):  # before that forward ended (and reported as such)
            assert (load.num_running, load.num_used_blocks) == (0, 0)
        runner.open()
        follower = loop.add("follower", [4, 5], SamplingParams(max_tokens=2))
        while not (await follower.get())[-1].finished:
            pass
        assert runner.forwards[0] == ["cancelled"]
        assert all("cancelled" not in forward for forward in runner.forwards[1:]), runner.forwards
    finally:
        runner.open()
        loop.stop()


async def test_requests_the_thread_has_added_count_in_the_load_before_the_next_step_ends():
    """The load report (and the queue limit, read from it) counts a request from its arrival on: the engine
    thread's snapshot must include the requests it has just added, not only those left pending - between the
    two, a full queue once read as empty for a whole (seconds-long) step and let requests past its limit."""
    runner = GatedRunner()
    loop = EngineLoop(Engine(EngineConfig(num_speculative_tokens=0, async_scheduling=False), runner=runner))
    loop.start()
    try:
        loop.add("running", [1, 2, 3], LONG)
        assert await asyncio.to_thread(runner.entered.acquire, timeout=5)
        loop.add("a", [4, 5], LONG)
        loop.add("b", [6, 7], LONG)
        runner.permit.release()  # the first step ends; the thread adds a and b and begins the next
        assert await asyncio.to_thread(runner.entered.acquire, timeout=5)
        load, num_pending = loop.queue_state()
        assert load.num_running + load.num_waiting + num_pending == 3, (load, num_pending)
    finally:
        runner.open()
        loop.stop()


async def test_requests_sharing_a_queue_get_one_list_per_step():
    """A Serve stream's requests share one queue: each step puts one list there, with every request's output."""
    loop = engine_loop()
    shared: asyncio.Queue = asyncio.Queue()
    loop.add("a", [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True), shared)
    loop.add("b", [4, 5], SamplingParams(max_tokens=5, ignore_eos=True), shared)
    loop.start()
    try:
        lists = []
        while sum(output.finished for items in lists for output in items) < 2:
            lists.append(await asyncio.wait_for(shared.get(), 10))
        assert [sorted(output.request_id for output in items) for items in lists] == [["a", "b"]] * 5
    finally:
        loop.stop()
