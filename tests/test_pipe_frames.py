"""specd/pipe_frames.py: the messages a real multiprocessing Pipe carries, read in one call whatever their sizes, and
pickled() read back by a plain Connection.recv."""
import multiprocessing
import threading

import pytest

from specd.pipe_frames import PipeReader, pickled


@pytest.fixture
def pipe():
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    reader = PipeReader(ours)
    yield ours, theirs, reader
    reader.close()
    ours.close()
    theirs.close()


def test_every_message_written_comes_out_in_order_in_one_call(pipe):
    ours, theirs, reader = pipe
    assert reader.available() == []
    ours.send(("step", 1))  # the Connection still sends, and blocks as before: the reader's recv alone is non-blocking
    assert theirs.recv() == ("step", 1)
    sent = [(1, "context", {"a": [1, 2]}), (1, "service", None), (2, "context", {})]
    for message in sent:
        theirs.send(message)
    assert reader.wait(1.0)
    assert reader.available() == sent
    assert reader.available() == []


def test_large_messages_are_whole_however_the_bytes_arrive(pipe):
    """Over 16 KiB the Connection writes the header apart from the body, and 3 MB is more than one recv takes."""
    _, theirs, reader = pipe
    sent = [list(range(5_000)), "x" * 3_000_000, {"small": 1}]
    writer = threading.Thread(target=lambda: [theirs.send(message) for message in sent])
    writer.start()
    received = []
    while len(received) < len(sent):
        assert reader.wait(5.0)
        received += reader.available()
    writer.join()
    assert received == sent


def test_wait_times_out_when_nothing_comes(pipe):
    _, _, reader = pipe
    assert not reader.wait(0.01)


def test_the_peer_closing_reads_as_eof_after_the_last_message(pipe):
    ours, theirs, reader = pipe
    theirs.send("last")
    theirs.close()
    assert reader.wait(1.0)
    assert reader.available() == ["last"]
    with pytest.raises(EOFError):
        reader.available()


def test_messages_written_before_the_peer_closed_are_read_even_past_one_recv(pipe):
    """Over 64 KiB arrives in more than one recv, and the end of the pipe comes in the same call."""
    _, theirs, reader = pipe
    sent = ["y" * 200_000, "after"]

    def write_and_close():
        for message in sent:
            theirs.send(message)
        theirs.close()
    writer = threading.Thread(target=write_and_close)
    writer.start()
    received = []
    with pytest.raises(EOFError):
        while reader.wait(5.0):
            received += reader.available()
    writer.join()
    assert received == sent


def test_pickled_bytes_are_what_a_connection_receives(pipe):
    ours, theirs, _ = pipe
    message = ("step", [("r0", 0, [1, 2, 3], 4, 1, 3, "")], {"r0": [5, 6]})
    ours.send_bytes(pickled(message))
    assert theirs.recv() == message
