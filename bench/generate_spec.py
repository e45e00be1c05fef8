"""The speculative workload of ``python -m bench.generate``: the service on the speculative pair, without and
with its ``generation.speculative``, and the acceptance its metrics show.

The pair (target ``demo-spec-target``, draft ``demo-spec-draft``) is built into ``.bench/models`` by
``python -m deployments.tools.demo_pair --repository .bench/models`` on first use. The service's config
is retargeted to the target (``bench.generate_systems.retarget_config``) and, for the second run, gets
``speculative: {method: draft, draft: {name: demo-spec-draft, version: "1"}, tokens: 4}`` in the generate
application's ``args.generation`` (taken as opaque YAML: the service validates it).

Acceptance: Ray's Prometheus endpoints of the service's private Ray instance (the ``metrics_export_port_*``
files of its session directory, found through the instance's process session) are scraped after each
point; every ``ray_generate_spec_*`` sample is summed over its labels and the point keeps the deltas. Where
an accepted and a proposed (or drafted) counter are among them, their ratio is the point's acceptance;
where none is exported, nothing is said. Ray exports every few seconds, so a point's deltas lag a little.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from bench import procs
from bench.generate_systems import _generate_apps, retarget_config
from bench.service import ROOT, load_config

TARGET, DRAFT = "demo-spec-target", "demo-spec-draft"
SPEC_OFF, SPEC_ON = "service-nospec", "service-spec"
SPEC_PREFIX = "ray_generate_spec_"
DRAFT_TOKENS = 4
_PORT_FLAGS = re.compile(r"--metrics[-_]export[-_]port[= ](\d+)")
_TEMP_DIR = re.compile(r"--temp-dir[= ](\S+)")
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")


def speculative_block(draft: str = DRAFT, version: str = "1", tokens: int = DRAFT_TOKENS) -> dict[str, Any]:
    return {"method": "draft", "draft": {"name": draft, "version": version}, "tokens": tokens}


def with_speculative(
    config: dict[str, Any], model: str, speculative: dict[str, Any] | None
) -> dict[str, Any]:
    """A copy of ``config`` whose generate application serving ``model`` has ``args.generation.speculative``
    set to ``speculative`` (None: removed)."""
    cfg = copy.deepcopy(config)
    apps = [a for a in _generate_apps(cfg) if a["args"]["model"].get("name") == model]
    if not apps:
        raise ValueError(f"no generate application serves {model}")
    generation = apps[0]["args"].get("generation")
    generation = dict(generation) if isinstance(generation, dict) else {}
    generation.pop("speculative", None)
    if speculative is not None:
        generation["speculative"] = copy.deepcopy(speculative)
    apps[0]["args"]["generation"] = generation
    return cfg


def spec_config(
    config_path: Path,
    target_dir: Path,
    out_dir: Path,
    speculative: dict[str, Any] | None,
    precision: str | None = None,
    model: str = TARGET,
) -> Path:
    """The service's config for one speculative run, written to ``out_dir`` (``service-config-spec.yaml``
    or ``service-config-nospec.yaml``)."""
    cfg, change = retarget_config(load_config(config_path), model, target_dir, precision)
    cfg = with_speculative(cfg, model, speculative)
    name = "service-config-spec.yaml" if speculative is not None else "service-config-nospec.yaml"
    path = out_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    state = "with" if speculative is not None else "without"
    head = f"# {config_path} retargeted ({change or 'as is'}), {state} generation.speculative\n"
    path.write_text(head + yaml.safe_dump(cfg, sort_keys=False))
    return path


def ensure_pair(repository: Path, log: Callable[[str], None]) -> tuple[Path, str]:
    """The target's model dir (built with ``deployments.tools.demo_pair`` when missing), and '' or
    why there is none."""
    target = repository / TARGET / "1"
    if (target / "config.json").is_file() and (repository / DRAFT / "1" / "config.json").is_file():
        return target, ""
    if not (ROOT / "deployments" / "tools" / "demo_pair.py").is_file():
        return target, "no deployments.tools.demo_pair to build the speculative pair with"
    log("building the speculative pair (python -m deployments.tools.demo_pair) ...")
    cmd = [sys.executable, "-m", "deployments.tools.demo_pair", "--repository", str(repository)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0 or not (target / "config.json").is_file():
        return target, f"building the pair failed (exit {done.returncode}): {done.stderr[-400:]}"
    return target, ""


def metrics_ports(session: int | None, cmdlines: Iterable[tuple[int, str]] | None = None) -> list[int]:
    """The Prometheus ports of the private Ray instance whose processes run in ``session``: the
    ``metrics_export_port_<node>`` files of its session directory (under the ``--temp-dir`` on its host's
    command line, ``bench.serve_host``), else a nonzero ``--metrics-export-port`` on a command line."""
    if session is None:
        return []
    if cmdlines is None:
        cmdlines = [(pid, procs.cmdline(pid)) for pid in procs.find_leftovers(session)]
    ports: set[int] = set()
    for _, line in cmdlines:
        ports |= {int(m.group(1)) for m in _PORT_FLAGS.finditer(line) if int(m.group(1))}
        for temp_dir in _TEMP_DIR.findall(line):
            for path in Path(temp_dir).glob("session_latest/metrics_export_port_*"):
                try:
                    ports.add(int(path.read_text().strip()))
                except (OSError, ValueError):
                    continue
    return sorted(p for p in ports if p)


def spec_samples(text: str) -> dict[str, float]:
    """The ``ray_generate_spec_*`` samples of a Prometheus text page, summed over their labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m and m.group(1).startswith(SPEC_PREFIX):
            try:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
            except ValueError:
                continue
    return out


def scrape(ports: Iterable[int], timeout_s: float = 5.0) -> dict[str, float]:
    """Every port's ``ray_generate_spec_*`` samples, summed."""
    total: dict[str, float] = {}
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as resp:
                text = resp.read().decode("utf-8", errors="replace")
        except (OSError, ValueError):
            continue
        for name, value in spec_samples(text).items():
            total[name] = total.get(name, 0.0) + value
    return total


def deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(v - before.get(k, 0.0), 3) for k, v in after.items()}


def acceptance(delta: dict[str, float]) -> float | None:
    """Accepted over proposed draft tokens, from counters whose names say so (``..._total`` or not);
    else the mean of an acceptance histogram (``..._sum`` / ``..._count``); else None."""

    def pick(words: tuple[str, ...], unless: str = "") -> float | None:
        for name, value in delta.items():
            short = name[len(SPEC_PREFIX) :]
            if name.endswith(("_bucket", "_sum", "_count", "_created")) or (unless and unless in short):
                continue
            if any(w in short for w in words):
                return value
        return None

    accepted = pick(("accepted",))
    proposed = pick(("proposed", "drafted", "draft_tokens"), unless="accept")
    if accepted is not None and proposed:
        return round(accepted / proposed, 3)
    for name, value in delta.items():
        if "accept" in name and name.endswith("_sum"):
            count = delta.get(name[: -len("_sum")] + "_count")
            if count:
                return round(value / count, 3)
    return None
