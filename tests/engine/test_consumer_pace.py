"""ConsumerPace: whether a stage's consumer is idle between its calls (the median share of
each call's time it spent away, over its last calls, with hysteresis)."""

from gristmill._src.engine.policy import ConsumerPace


def feed(pace, calls):
    for away, call in calls:
        pace.record(away, call)
    return pace.idle


def test_a_guess_of_idle_is_overturned_by_one_busy_call_and_kept_by_idle_ones():
    assert feed(ConsumerPace(idle=True), [(1e-6, 1e-3)] * 2) is True
    assert feed(ConsumerPace(idle=True), [(5e-3, 1e-3)]) is False


def test_a_consumer_away_under_5_percent_of_the_time_is_idle():
    assert feed(ConsumerPace(), [(1e-5, 1e-3)] * 8) is True
    assert feed(ConsumerPace(), [(1e-4, 1e-3)] * 8) is False  # 9 % away: busy


def test_a_rare_pause_does_not_make_an_idle_consumer_busy():
    # freeing a large batch or a garbage collection: 2 ms away once in eight calls
    calls = [(1e-5, 1e-3)] * 7 + [(2e-3, 1e-3)]
    assert feed(ConsumerPace(idle=True), calls * 4) is True


def test_a_consumer_away_at_every_call_turns_busy_within_a_few_calls():
    pace = ConsumerPace()
    feed(pace, [(1e-5, 1e-3)] * 8)
    assert pace.idle is True
    assert feed(pace, [(5e-3, 1e-3)] * 5) is False


def test_between_the_thresholds_the_last_verdict_stands():
    ten_percent = [(1.1e-4, 1e-3)] * 8
    assert feed(ConsumerPace(idle=True), [(1e-6, 1e-3)] * 8 + ten_percent) is True
    assert feed(ConsumerPace(idle=False), [(1e-3, 1e-3)] * 8 + ten_percent) is False
