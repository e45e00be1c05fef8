import pytest

from bench.hop_probe import Samples, main, measure, render


@pytest.mark.parametrize("transport", ["tcp", "grpc-aio", "grpc-sync"])
def test_each_transport_times_every_call_one_way_and_back(transport: str) -> None:
    measured = measure(transport, [0.0, 0.002], calls=3)
    assert list(measured) == [0.0, 0.002]
    for samples in measured.values():
        assert len(samples.out) == len(samples.back) == 3
        # one clock for both processes: the handler runs after the call leaves and before its answer lands
        assert all(0 < ns < 5e9 for ns in samples.out + samples.back)


def test_render_reads_the_percentiles_in_milliseconds() -> None:
    samples = Samples()
    for i in range(1, 11):
        samples.add(0, (i * 1_000_000).to_bytes(8, "little"), i * 1_000_000 + 500_000)
    table = render({"tcp": {0.02: samples}})
    assert "| tcp | 20 ms | 5.500 / 9.100 | 0.500 | 6.000 |" in table


def test_an_unknown_transport_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--transports", "tcp,pigeon"])
    assert exit_info.value.code == 2
    assert "pigeon" in capsys.readouterr().err
