"""Stop strings: held back while they may be starting, never returned, finishing the request."""
from gateway.stop import StopStringMatcher


def feed_all(matcher, deltas):
    return [matcher.feed(delta) for delta in deltas]


def test_text_without_stop_strings_passes_through_unchanged():
    matcher = StopStringMatcher(())
    assert feed_all(matcher, ["a", "b##", "c"]) == ["a", "b##", "c"]
    assert not matcher.stopped


def test_the_stop_string_and_everything_after_it_are_dropped():
    matcher = StopStringMatcher(("END",))
    assert feed_all(matcher, ["hello END", " more"]) == ["hello ", ""]
    assert matcher.stopped and matcher.flush() == ""


def test_a_stop_string_split_over_deltas_is_held_back_then_dropped():
    matcher = StopStringMatcher(("</answer>",))
    assert feed_all(matcher, ["42</", "ans", "wer> tail"]) == ["42", "", ""]
    assert matcher.stopped


def test_held_text_that_turns_out_not_to_stop_is_released():
    matcher = StopStringMatcher(("</answer>",))
    assert feed_all(matcher, ["a</", "an", "d b"]) == ["a", "", "</and b"]
    assert not matcher.stopped


def test_held_text_is_flushed_at_the_end_of_the_stream():
    matcher = StopStringMatcher(("STOP",))
    assert feed_all(matcher, ["go ST"]) == ["go "]
    assert matcher.flush() == "ST"


def test_the_earliest_of_several_stop_strings_wins():
    matcher = StopStringMatcher(("world", "lo"))
    assert matcher.feed("hello world") == "hel"


def test_a_stop_string_inside_a_longer_partial_match_is_found():
    matcher = StopStringMatcher(("abcd", "bc"))
    assert feed_all(matcher, ["xab", "c"]) == ["x", "a"]
    assert matcher.stopped
