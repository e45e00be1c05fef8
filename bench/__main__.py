"""``python -m bench run ...`` / ``python -m bench ramp ...`` / ``python -m bench corpus``."""

from __future__ import annotations

import signal
import sys

from bench.cli import parse


def exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit, so that ``finally`` blocks stop every server this run started."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    exit_on_sigterm()
    if opts.mode == "ramp":
        from bench.ramp import ramp

        ramp(opts)
    else:
        from bench.runner import run

        run(opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
