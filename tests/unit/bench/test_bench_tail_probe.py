from bench.tail_probe import Answered, by_length, slowest


def test_by_length_bins_by_token_count_and_leaves_empty_bins_out() -> None:
    answers = [Answered(10, 0.010), Answered(20, 0.030), Answered(200, 0.050)]
    lines = by_length(answers)
    assert len(lines) == 2
    assert lines[0].startswith("  tokens 0-31: n 2, p50 20.0") and lines[0].endswith("max 30.0 ms")
    assert lines[1].startswith("  tokens 128+: n 1, p50 50.0")


def test_slowest_takes_the_slowest_share_slowest_first_and_at_least_one() -> None:
    answers = [Answered(i, i / 1000) for i in range(1, 301)]
    top = slowest(answers)
    assert [a.tokens for a in top] == [300, 299, 298]
    assert slowest(answers[:5]) == [answers[4]]
    assert slowest([]) == []
