"""A locked-down cluster (k8s/README.md): Ray's token, the API keys' Secret, non-root pods with a read-only
root, and no dashboard outside the cluster. Each check is a function that lists what is wrong, so that the
broken copies below show that every one of them can fail.

The NetworkPolicy: test_network_policy.py."""

from __future__ import annotations

import copy
import posixpath
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from packaging.version import Version

from deployments.tools.check import ROUTER
from tests.unit.k8s.conftest import ROOT, apps, cluster, containers

TENANTS_SECRET = "textserve-tenants"
RAY_UID = 1000  # the rayproject/ray image's user ray
TOKEN_AUTH_SINCE = Version("2.52.0")  # the Ray release with token authentication
# Kinds that would put a port of the cluster outside it: none belongs in k8s/ (KubeRay makes ClusterIP ones).
EXPOSING_KINDS = {"Service", "Ingress", "Route", "Gateway", "HTTPRoute", "GRPCRoute"}

Problems = Iterator[str]


def _groups(rayservice: dict[str, Any]) -> list[dict[str, Any]]:
    spec = cluster(rayservice)
    return [spec["headGroupSpec"], *spec["workerGroupSpecs"]]


def keys_file(rayservice: dict[str, Any]) -> str | None:
    (router,) = apps(yaml.safe_load(rayservice["spec"]["serveConfigV2"]), ROUTER)
    return ((router.get("args") or {}).get("auth") or {}).get("keys_file")


def token_auth(rayservice: dict[str, Any]) -> Problems:
    spec = cluster(rayservice)
    auth = spec.get("authOptions") or {}
    if auth.get("mode") != "token":
        yield f"authOptions.mode is {auth.get('mode')!r}, not token"
    if auth.get("enableK8sTokenAuth"):
        yield "enableK8sTokenAuth: KubeRay supports it for RayClusters only, not a RayService"
    if Version(spec["rayVersion"]) < TOKEN_AUTH_SINCE:
        yield f"rayVersion {spec['rayVersion']} has no token authentication"


def tenants_secret(rayservice: dict[str, Any]) -> Problems:
    path = keys_file(rayservice)
    if not path or not posixpath.isabs(path):
        yield f"the router's args.auth.keys_file is {path!r}, not an absolute path"
        return
    directory, name = posixpath.split(path)
    for group in _groups(rayservice):
        volumes = {v["name"]: v for v in group["template"]["spec"].get("volumes", [])}
        for container in containers(group):
            mounts = [m for m in container.get("volumeMounts", []) if m["mountPath"] == directory]
            secret = (volumes.get(mounts[0]["name"], {}) if mounts else {}).get("secret") or {}
            where = f"{container['name']}: {directory}"
            if secret.get("secretName") != TENANTS_SECRET:
                yield f"{where} is not the Secret {TENANTS_SECRET}"
                continue
            if not mounts[0].get("readOnly") or "subPath" in mounts[0]:
                yield f"{where}: mount it readOnly, and whole (a subPath never sees the Secret change)"
            if {"key": name, "path": name} not in secret.get("items", [{"key": name, "path": name}]):
                yield f"{where}: the Secret's key {name} is not the file {name}"
            if secret.get("defaultMode", 0o644) & 0o007:
                yield f"{where}: the tenants file is readable by every user (defaultMode)"


def _sources(rayservice: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(name, container, its pod's securityContext) for every container of the Ray pods, the sidecar too."""
    spec = cluster(rayservice)
    for group in _groups(rayservice):
        pod = group["template"]["spec"].get("securityContext") or {}
        for container in containers(group) + group["template"]["spec"].get("initContainers", []):
            yield container["name"], container, pod
    if spec.get("enableInTreeAutoscaling"):
        pod = spec["headGroupSpec"]["template"]["spec"].get("securityContext") or {}
        yield "autoscaler", spec.get("autoscalerOptions") or {}, pod


def non_root(rayservice: dict[str, Any]) -> Problems:
    for group in _groups(rayservice):
        pod = group["template"]["spec"]
        if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
            yield f"{group.get('groupName', 'head')}: shares a host namespace"
        if any("hostPath" in v for v in pod.get("volumes", [])):
            yield f"{group.get('groupName', 'head')}: mounts a hostPath"
    for name, container, pod in _sources(rayservice):
        own = container.get("securityContext") or {}
        effective = {**pod, **own}  # a container's own setting wins over its pod's
        if effective.get("runAsNonRoot") is not True or effective.get("runAsUser") != RAY_UID:
            yield f"{name}: not run as the non-root user {RAY_UID}"
        if (effective.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            yield f"{name}: no RuntimeDefault seccomp profile"
        if own.get("allowPrivilegeEscalation") is not False or own.get("privileged"):
            yield f"{name}: may gain privileges"
        capabilities = own.get("capabilities") or {}
        if capabilities.get("drop") != ["ALL"] or capabilities.get("add"):
            yield f"{name}: keeps capabilities (drop must be [ALL], nothing added)"
        if own.get("readOnlyRootFilesystem") is not True:
            yield f"{name}: its root filesystem is writable"


def writable_paths(rayservice: dict[str, Any]) -> Problems:
    """With a read-only root, Ray writes to /tmp (session dir, logs, spilling) and /dev/shm (object store):
    both must be emptyDirs with a size limit, and nothing else may be writable but an emptyDir."""
    spec = cluster(rayservice)
    head_volumes = spec["headGroupSpec"]["template"]["spec"].get("volumes", [])
    checks = [(c["name"], c, group["template"]["spec"].get("volumes", [])) for group in _groups(rayservice)
              for c in containers(group)]  # fmt: skip
    if spec.get("enableInTreeAutoscaling"):
        checks.append(("autoscaler", spec.get("autoscalerOptions") or {}, head_volumes))
    for name, container, volumes in checks:
        by_name = {v["name"]: v for v in volumes}
        mounts = {m["mountPath"]: by_name.get(m["name"], {}) for m in container.get("volumeMounts", [])}
        wanted = {"/tmp"} if name == "autoscaler" else {"/tmp", "/dev/shm"}
        for path in sorted(wanted):
            if "emptyDir" not in mounts.get(path, {}):
                yield f"{name}: {path} is not an emptyDir (read-only root)"
        shm = mounts.get("/dev/shm", {}).get("emptyDir") or {}
        if "/dev/shm" in wanted and shm.get("medium") != "Memory":
            yield f"{name}: /dev/shm is not in memory"
        for mount in container.get("volumeMounts", []):
            volume = by_name.get(mount["name"], {})
            if "emptyDir" in volume and "sizeLimit" not in volume["emptyDir"]:
                yield f"{name}: {mount['mountPath']} has no sizeLimit (it could fill the node)"
            elif "emptyDir" not in volume and not mount.get("readOnly"):
                yield f"{name}: {mount['mountPath']} is writable and not an emptyDir"


def dashboard_not_exposed(rayservice: dict[str, Any]) -> Problems:
    head = cluster(rayservice)["headGroupSpec"]
    if head.get("serviceType", "ClusterIP") != "ClusterIP":
        yield f"the head service is a {head['serviceType']}"
    if head.get("enableIngress"):
        yield "headGroupSpec.enableIngress makes an Ingress for the dashboard"
    serve = rayservice["spec"].get("serveService") or {}
    if (serve.get("spec") or {}).get("type", "ClusterIP") != "ClusterIP":
        yield f"the serve Service is a {serve['spec']['type']} (put an ingress controller in front instead)"
    serve_config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    for app in serve_config["applications"]:
        # Only the router checks API keys: no other application may take HTTP requests of its own.
        if app.get("import_path") != ROUTER and app.get("route_prefix", "/") is not None:
            yield f"application {app['name']} is on HTTP without the router's key check"


CHECKS: list[Callable[[dict[str, Any]], Problems]] = [
    token_auth,
    tenants_secret,
    non_root,
    writable_paths,
    dashboard_not_exposed,
]


def problems(rayservice: dict[str, Any]) -> list[str]:
    return [problem for check in CHECKS for problem in check(rayservice)]


def test_every_rayservice_is_locked_down(rayservice: dict[str, Any]) -> None:
    assert problems(rayservice) == []
    assert keys_file(rayservice) == "/etc/textserve/auth/tenants.yaml"


HEAD = "spec.rayClusterConfig.headGroupSpec"
WORKER = "spec.rayClusterConfig.workerGroupSpecs.0"
HEAD_POD = f"{HEAD}.template.spec"
WORKER_RAY = f"{WORKER}.template.spec.containers.0"
HEAD_RAY = f"{HEAD_POD}.containers.0"
AUTOSCALER = "spec.rayClusterConfig.autoscalerOptions"


def _edit(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        doc = doc[int(key)] if isinstance(doc, list) else doc.setdefault(key, {})
    if value is KeyError:
        del doc[int(last) if isinstance(doc, list) else last]
    else:
        doc[last] = value


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("spec.rayClusterConfig.authOptions", KeyError, "not token"),
        ("spec.rayClusterConfig.authOptions.mode", "disabled", "not token"),
        ("spec.rayClusterConfig.authOptions.enableK8sTokenAuth", True, "RayClusters only"),
        ("spec.rayClusterConfig.rayVersion", "2.51.0", "no token authentication"),
        (f"{WORKER_RAY}.volumeMounts.2", KeyError, "is not the Secret"),
        (f"{WORKER_RAY}.volumeMounts.2.subPath", "tenants.yaml", "mount it readOnly, and whole"),
        (f"{HEAD_POD}.volumes.3.secret.defaultMode", 0o644, "readable by every user"),
        (f"{HEAD_POD}.volumes.3.secret.items.0.path", "keys.yaml", "is not the file"),
        (f"{WORKER_RAY}.securityContext.runAsNonRoot", False, "ray-worker: not run as"),
        (f"{WORKER_RAY}.securityContext.runAsUser", 0, "ray-worker: not run as"),
        (f"{HEAD_RAY}.securityContext.seccompProfile", {"type": "Unconfined"}, "ray-head: no RuntimeDefault"),
        (f"{WORKER_RAY}.securityContext.allowPrivilegeEscalation", True, "may gain privileges"),
        (f"{WORKER_RAY}.securityContext.capabilities", {"drop": ["ALL"], "add": ["NET_RAW"]}, "capabilities"),
        (f"{AUTOSCALER}.securityContext.readOnlyRootFilesystem", False, "autoscaler: its root filesystem"),
        (f"{WORKER}.template.spec.hostNetwork", True, "host namespace"),
        (f"{WORKER_RAY}.volumeMounts.1", KeyError, "ray-worker: /tmp is not an emptyDir"),
        (f"{AUTOSCALER}.volumeMounts", [], "autoscaler: /tmp is not an emptyDir"),
        (f"{HEAD_POD}.volumes.1.emptyDir", {}, "ray-head: /tmp has no sizeLimit"),
        (f"{HEAD_POD}.volumes.0.emptyDir.medium", "", "ray-head: /dev/shm is not in memory"),
        (f"{HEAD}.serviceType", "LoadBalancer", "head service is a LoadBalancer"),
        (f"{HEAD}.enableIngress", True, "makes an Ingress"),
        ("spec.serveService", {"spec": {"type": "NodePort"}}, "serve Service is a NodePort"),
    ],
)
def test_broken_copies_are_caught(rayservice: dict[str, Any], path: str, value: Any, expected: str) -> None:
    broken = copy.deepcopy(rayservice)
    _edit(broken, path, value)
    found = problems(broken)
    assert any(expected in p for p in found), found


def test_a_model_on_http_of_its_own_is_caught(rayservice: dict[str, Any]) -> None:
    broken = copy.deepcopy(rayservice)
    serve_config = yaml.safe_load(broken["spec"]["serveConfigV2"])
    next(a for a in serve_config["applications"] if a["import_path"] != ROUTER)["route_prefix"] = "/raw"
    broken["spec"]["serveConfigV2"] = yaml.safe_dump(serve_config)
    assert any("without the router's key check" in p for p in problems(broken))


def test_the_mount_follows_the_keys_file(rayservice: dict[str, Any]) -> None:
    broken = copy.deepcopy(rayservice)
    serve_config = yaml.safe_load(broken["spec"]["serveConfigV2"])
    (router,) = apps(serve_config, ROUTER)
    router["args"]["auth"]["keys_file"] = "/etc/elsewhere/tenants.yaml"
    broken["spec"]["serveConfigV2"] = yaml.safe_dump(serve_config)
    assert any("/etc/elsewhere is not the Secret" in p for p in problems(broken))
    del router["args"]["auth"]
    broken["spec"]["serveConfigV2"] = yaml.safe_dump(serve_config)
    assert any("keys_file is None" in p for p in problems(broken))


def test_no_key_material_and_no_exposing_object_in_k8s() -> None:
    for path in sorted((ROOT / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict):
                kind = doc.get("kind")
                assert kind != "Secret", f"{path.name}: Secrets are made on the cluster, never committed"
                assert kind not in EXPOSING_KINDS, f"{path.name}: {kind} exposes the cluster"


def test_readme_says_how_to_make_the_secret() -> None:
    readme = (ROOT / "k8s" / "README.md").read_text()
    assert f"create secret generic {TENANTS_SECRET} --from-file=tenants.yaml=" in readme
    assert "python -m deployments.tools.keys" in readme
