"""deployments.tools.packed_probe: both graphs built from the same weights and timed side by side."""

from __future__ import annotations

import re

import pytest

from deployments.tools import packed_probe


def test_prints_a_ratio_per_shape(capsys: pytest.CaptureFixture[str]) -> None:
    packed_probe.main(["--rounds", "1", "--shapes", "1x8,2x16"])
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (\d+) x (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", out, flags=re.MULTILINE)
    assert [(r[0], r[1]) for r in rows] == [("1", "8"), ("2", "16")]
    for _, _, plain, packed, ratio in rows:
        assert float(plain) > 0 and float(packed) > 0
        assert float(ratio) == pytest.approx(float(packed) / float(plain), abs=0.01)
