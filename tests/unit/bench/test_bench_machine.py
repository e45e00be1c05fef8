"""Machine description helpers."""

from __future__ import annotations

import time

from bench.machine import (
    OtherLoadProbe,
    busy_fraction,
    cpu_model,
    descendants,
    mem_total_gib,
    versions,
    wait_for_quiet,
)


def test_cpu_model_and_memory_from_proc_text() -> None:
    assert cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags: x\n") == "AMD EPYC 7B13"
    zen5 = "cpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx512f avx512_bf16 sse\n"
    second_cpu = "\nprocessor\t: 1\nflags\t\t: fpu amx_bf16\n"  # only the first processor is read
    assert cpu_model(zen5 + second_cpu) == "AMD EPYC (family 26 model 2, avx512f, avx512_bf16)"
    assert mem_total_gib("MemTotal:       24576000 kB\nMemFree: 1 kB\n") == 23.4
    assert mem_total_gib("nothing") is None


def test_busy_fraction() -> None:
    assert busy_fraction((100, 1000), (150, 1100)) == 0.5
    assert busy_fraction((0, 0), (0, 0)) == 0.0


def test_versions_lists_python_and_extras() -> None:
    v = versions({"infinity-emb": "0.0.78"})
    assert v["python"].count(".") == 2 and v["infinity-emb"] == "0.0.78"


def test_descendants_follow_parent_links() -> None:
    table = {1: (0, 1, 0), 10: (1, 10, 5), 11: (10, 10, 5), 12: (11, 10, 5), 20: (1, 20, 5)}
    assert descendants(table, 10) == {10, 11, 12}
    assert descendants(table, 20) == {20}


def test_other_load_probe_reports_a_share() -> None:
    probe = OtherLoadProbe(server_session=None)
    assert probe.stop() is None  # not started
    probe.start()
    share = probe.stop()
    assert share is None or 0.0 <= share <= 1.0


def test_wait_for_quiet_is_bounded() -> None:
    t0 = time.monotonic()
    load = wait_for_quiet(None, threshold=-1.0, max_wait_s=0.2, sample_s=0.05)  # never quiet enough
    assert time.monotonic() - t0 < 1.0
    assert load is None or load >= 0.0
