"""Make and manage the tenants file: tenants, their policies and their API keys (stored as salted hashes).

    python -m deployments.tools.keys add-key --file tenants.yaml --tenant search   # prints the new key once
    python -m deployments.tools.keys set-policy --file tenants.yaml --tenant bulk --priority batch \\
        --models all-MiniLM-L6-v2 --requests-per-s 20 --input-tokens-per-min 2000000
    python -m deployments.tools.keys revoke --file tenants.yaml --tenant search --key-id search-1
    python -m deployments.tools.keys list --file tenants.yaml                     # names and key ids only

A running service reads the file again within ``auth.reload_interval_s`` of a change: add the new key,
hand it out, then revoke the old one (rotation with no restart). On Kubernetes the file is the Secret
``textserve-tenants`` (``k8s/README.md``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from deployments.access.tenants import Tenant, TenantsFile, new_key, store_key


def _read(path: Path) -> TenantsFile:
    return TenantsFile.read(path) if path.exists() else TenantsFile()


def _with_tenant(tenants: TenantsFile, name: str, tenant: Tenant) -> TenantsFile:
    return TenantsFile(tenants={**tenants.tenants, name: tenant})


def add_key(path: Path, tenant: str, key_id: str | None) -> str:
    """A new key for ``tenant`` (made with the default policy if it is new); the key, to hand out."""
    tenants = _read(path)
    current = tenants.tenants.get(tenant, Tenant())
    key_id = key_id or f"{tenant}-{len(current.keys) + 1}"
    if any(k.id == key_id for k in current.keys):
        raise SystemExit(f"tenant {tenant!r} already has a key {key_id!r}")
    key = new_key()
    updated = current.model_copy(update={"keys": (*current.keys, store_key(key, key_id))})
    _with_tenant(tenants, tenant, updated).write(path)
    return key


def revoke(path: Path, tenant: str, key_id: str) -> None:
    tenants = _read(path)
    current = tenants.tenants.get(tenant)
    if current is None or not any(k.id == key_id for k in current.keys):
        raise SystemExit(f"tenant {tenant!r} has no key {key_id!r}")
    kept = tuple(k for k in current.keys if k.id != key_id)
    _with_tenant(tenants, tenant, current.model_copy(update={"keys": kept})).write(path)


def set_policy(path: Path, tenant: str, policy: dict[str, Any]) -> None:
    tenants = _read(path)
    current = tenants.tenants.get(tenant, Tenant())
    updated = Tenant.model_validate(current.model_dump() | policy)  # validated as the service will
    _with_tenant(tenants, tenant, updated).write(path)


def describe(path: Path) -> str:
    lines = []
    for name, t in _read(path).tenants.items():
        ids = ", ".join(k.id for k in t.keys) or "no keys"
        lines.append(
            f"{name}: {t.priority}, models {list(t.models)}, {t.requests_per_s} req/s, "
            f"{t.input_tokens_per_min} input tokens/min; keys: {ids}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m deployments.tools.keys",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("add-key", "revoke", "set-policy", "list"):
        cmd = commands.add_parser(name)
        cmd.add_argument("--file", type=Path, required=True)
        if name != "list":
            cmd.add_argument("--tenant", required=True)
        if name in ("add-key", "revoke"):
            cmd.add_argument("--key-id", required=name == "revoke")
        if name == "set-policy":
            cmd.add_argument("--priority", choices=["interactive", "batch"])
            cmd.add_argument("--models", help="comma-separated names, or '*' for any")
            cmd.add_argument("--requests-per-s", type=float)
            cmd.add_argument("--burst-requests", type=float)
            cmd.add_argument("--input-tokens-per-min", type=float)
    args = parser.parse_args(argv)
    if args.command == "add-key":
        key = add_key(args.file, args.tenant, args.key_id)
        print(key)  # the only time the key exists in clear: give it to the tenant now
        print(f"stored its hash for tenant {args.tenant!r} in {args.file}", file=sys.stderr)
    elif args.command == "revoke":
        revoke(args.file, args.tenant, args.key_id)
    elif args.command == "set-policy":
        fields = ("priority", "requests_per_s", "burst_requests", "input_tokens_per_min")
        policy: dict[str, Any] = {f: getattr(args, f) for f in fields if getattr(args, f) is not None}
        if args.models is not None:
            policy["models"] = tuple(m.strip() for m in args.models.split(",") if m.strip())
        set_policy(args.file, args.tenant, policy)
    else:
        print(describe(args.file))


if __name__ == "__main__":
    main()
