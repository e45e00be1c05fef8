"""k8s/networkpolicy.yaml: its shape, against the networking.k8s.io/v1 types that the vendored KubeRay CRD
embeds (NetworkPolicyIngressRule, LabelSelector), and what it admits, by a small model of NetworkPolicy's
ingress semantics applied to every source that matters, against the Ray pods and ports of each generated
RayService.

No API server or network plugin runs here: the model is Kubernetes' documented semantics (a pod selected by a
policy for Ingress takes only what some rule admits; a rule without `from` or `ports` matches every source or
port; a peer's podSelector alone means the policy's namespace; namespaceSelector and podSelector in one peer
must both match)."""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from jsonschema import Draft7Validator

from tests.unit.k8s.conftest import ROOT, cluster, containers
from tests.unit.k8s.test_manifests import CRD_DIR, CRD_FILES, FORMATS, _closed

POLICY_FILE = ROOT / "k8s" / "networkpolicy.yaml"
# The RayService's and the policy's namespace (the file names none: it goes where it is applied).
NAMESPACE = "textserve"
OPERATOR_NS = "kuberay-system"  # k8s/README.md's helm install of the KubeRay operator
MONITORING_NS = "monitoring"  # k8s/README.md's helm install of kube-prometheus-stack
NS_NAME = "kubernetes.io/metadata.name"  # set by Kubernetes on every namespace, immutable
PROTOCOLS = {"TCP", "UDP", "SCTP"}
# Ray ports that no container declares: dashboard agent, object manager, a raylet/worker port.
UNDECLARED_RAY_PORTS = {52365, 8076, 10002}


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: Mapping[str, str]
    ports: Mapping[str, int] = field(default_factory=dict)  # named container ports (of a target)


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        matched = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }
        if op not in matched:
            raise ValueError(f"unknown selector operator {op!r}")
        if not matched[op]:
            return False
    return True


def _peer_admits(peer: Mapping[str, Any], source: Pod) -> bool:
    if "ipBlock" in peer:
        return False  # addresses outside the cluster's pods: none of the sources here
    namespaces = peer.get("namespaceSelector")
    in_namespace = (
        source.namespace == NAMESPACE
        if namespaces is None
        else selects(namespaces, {NS_NAME: source.namespace})
    )
    return in_namespace and ("podSelector" not in peer or selects(peer["podSelector"], source.labels))


def _port_admits(ports: list[Mapping[str, Any]] | None, target: Pod, port: int) -> bool:
    for entry in ports or [{}]:
        if entry.get("protocol", "TCP") != "TCP":
            continue
        wanted = entry.get("port")
        if wanted is None:
            return True
        first = target.ports.get(wanted) if isinstance(wanted, str) else wanted
        if first is not None and first <= port <= entry.get("endPort", first):
            return True
    return False


def admits(policies: list[dict[str, Any]], source: Pod, target: Pod, port: int) -> bool:
    """Whether ``source`` may open a TCP connection to ``target``:``port`` (``target`` is in NAMESPACE)."""
    isolating = [
        p
        for p in policies
        if "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and selects(p["spec"]["podSelector"], target.labels)
    ]
    if not isolating:
        return True
    return any(
        _port_admits(rule.get("ports"), target, port)
        and (not rule.get("from") or any(_peer_admits(peer, source) for peer in rule["from"]))
        for policy in isolating
        for rule in policy["spec"].get("ingress") or []
    )


@functools.cache
def policy_validator() -> Draft7Validator:
    text = (CRD_DIR / CRD_FILES["RayService"]).read_text()
    crd = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    rule = spec["rayClusterConfig"]["properties"]["networkPolicy"]["properties"]["head"]["properties"]
    rule = rule["ingressRules"]["items"]  # k8s.io/api networking/v1 NetworkPolicyIngressRule, as generated
    selector = rule["properties"]["from"]["items"]["properties"]["podSelector"]  # metav1.LabelSelector
    strings = {"type": "object", "additionalProperties": {"type": "string"}}
    schema = {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "networking.k8s.io/v1"},
            "kind": {"const": "NetworkPolicy"},
            "metadata": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string"}, "labels": strings, "annotations": strings},
            },
            "spec": {
                "type": "object",
                "required": ["podSelector"],
                "properties": {
                    "podSelector": selector,
                    "policyTypes": {"type": "array", "items": {"enum": ["Ingress", "Egress"]}},
                    "ingress": {"type": "array", "items": rule},
                },
            },
        },
    }
    return Draft7Validator(_closed(schema), format_checker=FORMATS)


def load_policies() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if isinstance(d, dict)]


def ray_pods(rayservice: dict[str, Any]) -> dict[str, Pod]:
    """Each group's pod as KubeRay makes it: the template's labels and KubeRay's own."""
    spec, pods = cluster(rayservice), {}
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        kind = "head" if group is spec["headGroupSpec"] else "worker"
        labels = {
            **group["template"]["metadata"].get("labels", {}),
            "ray.io/is-ray-node": "yes",
            "ray.io/node-type": kind,
            "ray.io/cluster": "textserve-raycluster-x7k2p",
            "ray.io/group": group.get("groupName", "headgroup"),
        }
        ports = {p["name"]: p["containerPort"] for c in containers(group) for p in c.get("ports", [])}
        pods[group.get("groupName", "head")] = Pod(NAMESPACE, labels, ports)
    return pods


OPERATOR = {"app.kubernetes.io/name": "kuberay-operator", "app.kubernetes.io/component": "kuberay-operator"}
PROMETHEUS = {"app.kubernetes.io/name": "prometheus", "app.kubernetes.io/managed-by": "prometheus-operator"}
# Who tries, and what each may reach beyond Serve's HTTP port ("all": every port; a port name: that port).
SOURCES: dict[str, tuple[Pod, set[str]]] = {
    "a client in another namespace": (Pod("default", {"app": "client"}), set()),
    "another pod in the namespace": (Pod(NAMESPACE, {"app": "batch-job"}), set()),
    "another RayCluster's pod in the namespace": (Pod(NAMESPACE, {"ray.io/is-ray-node": "yes"}), set()),
    "the operator": (Pod(OPERATOR_NS, OPERATOR), {"dashboard"}),
    "an operator look-alike in the namespace": (Pod(NAMESPACE, OPERATOR), set()),
    "an operator look-alike elsewhere": (Pod("tenant-a", OPERATOR), set()),
    "Prometheus": (Pod(MONITORING_NS, PROMETHEUS), {"metrics"}),
    "Grafana beside Prometheus": (Pod(MONITORING_NS, {"app.kubernetes.io/name": "grafana"}), set()),
    "a Prometheus look-alike elsewhere": (Pod("tenant-a", PROMETHEUS), set()),
}


def problems(policies: list[dict[str, Any]], rayservice: dict[str, Any]) -> list[str]:
    found = []
    for doc in policies:
        errors = policy_validator().iter_errors(doc)
        found += [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]
        for rule in doc["spec"].get("ingress") or []:
            found += [
                f"protocol {p['protocol']}"
                for p in rule.get("ports") or []
                if p.get("protocol") not in PROTOCOLS
            ]
    if found:
        return found
    pods = ray_pods(rayservice)
    sources = dict(SOURCES)
    for name, pod in pods.items():  # textserve's own Ray pods reach each other on every port
        sources[f"textserve's {name} pod"] = (pod, {"all"})
        sources[f"a textserve look-alike in another namespace ({name})"] = (Pod("other", pod.labels), set())
    for target_name, target in pods.items():
        ports = {**target.ports, **{str(p): p for p in UNDECLARED_RAY_PORTS}}
        for source_name, (source, allowed) in sources.items():
            for port_name, port in ports.items():
                want = port_name == "serve" or "all" in allowed or port_name in allowed
                if admits(policies, source, target, port) != want:
                    verb = "cannot reach" if want else "reaches"
                    found.append(f"{source_name} {verb} the {target_name} pod's {port_name} port ({port})")
    return found


def test_the_model_follows_kubernetes_semantics() -> None:
    target = Pod(NAMESPACE, {"app": "t"}, {"web": 80})
    a, b = Pod(NAMESPACE, {"role": "a"}), Pod("other", {"role": "a"})

    def policy(*rules: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"spec": {"podSelector": {"matchLabels": {"app": "t"}}, "ingress": list(rules)}}]

    assert admits([], b, target, 1)  # selected by no policy: not isolated
    assert not admits(policy(), a, target, 80)  # isolated, no rule
    assert admits(policy({}), b, target, 9)  # a rule without from and ports admits everything
    alone = {"from": [{"podSelector": {"matchLabels": {"role": "a"}}}]}
    assert admits(policy(alone), a, target, 9) and not admits(policy(alone), b, target, 9)
    other_ns = {"namespaceSelector": {"matchLabels": {NS_NAME: "other"}}}
    both = {"from": [{**other_ns, "podSelector": {"matchLabels": {"role": "x"}}}]}  # one peer: AND
    either = {"from": [other_ns, {"podSelector": {"matchLabels": {"role": "x"}}}]}  # two peers: OR
    assert not admits(policy(both), b, target, 9) and admits(policy(either), b, target, 9)
    ranged = {"ports": [{"port": 8000, "endPort": 8002}, {"port": "web"}, {"port": 53, "protocol": "UDP"}]}
    assert [admits(policy(ranged), a, target, n) for n in (7999, 8002, 80, 53)] == [False, True, True, False]
    labels = {"role": "a", "tier": "x"}
    assert selects({"matchExpressions": [{"key": "role", "operator": "In", "values": ["a", "b"]}]}, labels)
    assert not selects({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["x"]}]}, labels)
    assert selects({"matchExpressions": [{"key": "role", "operator": "Exists"}]}, labels)
    assert not selects({"matchExpressions": [{"key": "role", "operator": "DoesNotExist"}]}, labels)
    with pytest.raises(ValueError, match="unknown selector operator"):
        selects({"matchExpressions": [{"key": "role", "operator": "Equals"}]}, labels)


def test_network_policy_admits_exactly_what_the_cluster_needs(rayservice: dict[str, Any]) -> None:
    pods = ray_pods(rayservice)
    assert {"serve", "metrics"} <= set(pods["gpu"].ports), "the worker's named ports moved"
    assert {"serve", "metrics", "dashboard", "gcs-server", "client"} <= set(pods["head"].ports)
    assert problems(load_policies(), rayservice) == []


RULES = "spec.ingress"


def _edit(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        doc = doc[int(key)] if isinstance(doc, list) else doc[key]
    index = int(last) if isinstance(doc, list) else last
    if value is KeyError:
        del doc[index]
    else:
        doc[index] = value


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (f"{RULES}.0.ports.0.port", 8265, "a client in another namespace reaches the head pod's dashboard"),
        (f"{RULES}.1.from", KeyError, "a client in another namespace reaches the head pod's gcs-server"),
        (f"{RULES}.1.from.0.podSelector", {}, "another pod in the namespace reaches the gpu pod's 52365"),
        (
            f"{RULES}.1.from.0.namespaceSelector",
            {},
            "textserve look-alike in another namespace (head) reaches",
        ),
        (f"{RULES}.2.from.0.namespaceSelector", KeyError, "an operator look-alike in the namespace reaches"),
        (f"{RULES}.2.ports", KeyError, "the operator reaches the head pod's gcs-server"),
        (f"{RULES}.3.from.0.podSelector", KeyError, "Grafana beside Prometheus reaches the gpu pod's metr"),
        (f"{RULES}.3.ports.0.port", 8000, "Prometheus cannot reach the gpu pod's metrics"),
        ("spec.policyTypes", ["Egress"], "a client in another namespace reaches"),
        ("spec.podSelector", {"matchLabels": {"ray.io/node-type": "head"}}, "reaches the gpu pod's 10002"),
        (f"{RULES}.0.ports.0", {"protocol": "TCP", "prot": 8000}, "Additional properties are not allowed"),
        (f"{RULES}.0.ports.0.protocol", "tcp", "protocol tcp"),
        ("spec.policyTypes", ["ingress"], "'ingress' is not one of"),
        ("apiVersion", "networking.k8s.io/v1beta1", "'networking.k8s.io/v1' was expected"),
    ],
)
def test_broken_policies_are_caught(rayservice: dict[str, Any], path: str, value: Any, expected: str) -> None:
    broken = copy.deepcopy(load_policies())
    _edit(broken[0], path, value)
    found = problems(broken, rayservice)
    assert any(expected in p for p in found), found


def test_the_readme_installs_where_the_policy_looks() -> None:
    readme = (ROOT / "k8s" / "README.md").read_text()
    text = POLICY_FILE.read_text()
    for namespace in (OPERATOR_NS, MONITORING_NS):
        assert f"{NS_NAME}: {namespace}" in text
        assert f"--namespace {namespace}" in readme, f"k8s/README.md installs nothing into {namespace}"
    assert "kubectl -n textserve apply -f k8s/networkpolicy.yaml" in readme
