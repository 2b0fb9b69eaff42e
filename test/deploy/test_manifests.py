"""The Kubernetes manifests in deploy/: rendered, schema-checked, linted, and held to our rules.

Each overlay is rendered with ``kubectl kustomize``; every rendered document is validated with
``kubernetes-validate --strict`` (except custom resources such as the ServiceMonitor, which have no
built-in schema); ``yamllint`` runs on deploy/ with deploy/.yamllint; and the rule functions below
(pure functions over manifest dicts, returning a list of violations) check what a schema cannot.
Every rule is also run on a small bad manifest, so that a rule that cannot fail is caught.

Tools: kubectl (skipped with a reason when absent) and requirements/deploy.txt.
"""

from __future__ import annotations

import copy
import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
KUBECTL = shutil.which("kubectl")

OVERLAYS = ("gpu", "cpu-demo", "pd")
GPU_OVERLAYS = ("gpu", "pd")
# Kubernetes versions the rendered manifests must validate against: the kubectl we test with and
# the newest schema kubernetes-validate ships.
K8S_VERSIONS = ("1.32.0", "1.37.0")
# Custom resources: no built-in schema, checked by our rules only.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}

SERVER_PORT = 30000
WORKER_NAME = "sglang-iso-worker"
ROUTER_NAME = "sglang-iso-router"
TENANTS_SECRET = "sglang-iso-tenants"
TENANTS_MOUNT = "/etc/sglang-iso"
QUEUE_METRIC = "sglang:num_queue_reqs"
GPU = "nvidia.com/gpu"
# failureThreshold * periodSeconds of the worker's startup probe, per overlay.
STARTUP_BUDGET_S = {"gpu": 15 * 60, "cpu-demo": 5 * 60, "pd": 15 * 60}
ALLOWED_ROUTER_POLICIES = {"manual", "round_robin"}
# The one ingress peer besides the router: Prometheus pods in a namespace the operator labels.
PROMETHEUS_NS_LABEL = "sglang-iso.example.com/metrics-scraper"

Doc = dict[str, Any]

# --------------------------------------------------------------------------------------------
# Helpers


def pod_spec(doc: Doc) -> Doc | None:
    kind = doc.get("kind")
    spec = doc.get("spec") or {}
    if kind == "Pod":
        return spec
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        return (spec.get("template") or {}).get("spec") or {}
    if kind == "CronJob":
        job = (spec.get("jobTemplate") or {}).get("spec") or {}
        return (job.get("template") or {}).get("spec") or {}
    return None


def pod_labels(doc: Doc) -> dict[str, str]:
    if doc.get("kind") == "Pod":
        return (doc.get("metadata") or {}).get("labels") or {}
    return (((doc.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}


def containers(spec: Doc) -> list[Doc]:
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def name_of(doc: Doc) -> str:
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


def selects(selector: Doc | None, labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels and matchExpressions) selects these labels."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if (
            (op == "In" and labels.get(key) not in values)
            or (op == "NotIn" and labels.get(key) in values)
            or (op == "Exists" and key not in labels)
            or (op == "DoesNotExist" and key in labels)
        ):
            return False
    return True


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    for doc in docs:
        if doc.get("kind") == kind and (doc.get("metadata") or {}).get("name") == name:
            return doc
    raise AssertionError(f"{kind}/{name} not in the rendered output")


def container_args(container: Doc) -> list[str]:
    return [*(container.get("command") or []), *(container.get("args") or [])]


def flag_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


# --------------------------------------------------------------------------------------------
# Rules: each returns a list of violations (empty = fine)


def check_probes(doc: Doc) -> list[str]:
    """Every long-running container has startup, readiness and liveness probes."""
    spec = pod_spec(doc)
    if spec is None:
        return []
    errors = []
    for c in spec.get("containers") or []:
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if not c.get(probe):
                errors.append(f"{name_of(doc)} container {c.get('name')}: no {probe}")
    return errors


def check_worker_probes(doc: Doc, min_startup_s: int) -> list[str]:
    """The worker: startup + readiness on /health_generate, liveness on /health, enough startup time."""
    spec = pod_spec(doc) or {}
    expected = {"startupProbe": "/health_generate", "readinessProbe": "/health_generate", "livenessProbe": "/health"}
    errors = []
    cs = spec.get("containers") or []
    if not cs:
        return [f"{name_of(doc)}: no containers"]
    for c in cs:
        for probe, path in expected.items():
            got = ((c.get(probe) or {}).get("httpGet") or {}).get("path")
            if got != path:
                errors.append(f"{name_of(doc)} container {c.get('name')}: {probe} path {got!r}, want {path!r}")
        startup = c.get("startupProbe") or {}
        budget = startup.get("failureThreshold", 3) * startup.get("periodSeconds", 10)
        if budget < min_startup_s:
            errors.append(f"{name_of(doc)} container {c.get('name')}: startup budget {budget}s < {min_startup_s}s")
    return errors


def check_worker_args(doc: Doc) -> list[str]:
    """The worker serves on all interfaces, exports metrics and reads the tenants file from the Secret."""
    spec = pod_spec(doc) or {}
    errors = []
    for c in spec.get("containers") or []:
        args = container_args(c)
        if "--enable-metrics" not in args:
            errors.append(f"{name_of(doc)}: worker without --enable-metrics")
        if flag_value(args, "--host") != "0.0.0.0":
            errors.append(f"{name_of(doc)}: worker must listen on --host 0.0.0.0 (SGLang defaults to 127.0.0.1)")
        if flag_value(args, "--port") not in (None, str(SERVER_PORT)):
            errors.append(f"{name_of(doc)}: worker --port is not {SERVER_PORT}")
        tenants = flag_value(args, "--tenants-file")
        if tenants is None or not tenants.startswith(TENANTS_MOUNT + "/"):
            errors.append(f"{name_of(doc)}: --tenants-file {tenants!r} is not under {TENANTS_MOUNT}")
        if flag_value(args, "--model-path") is None:
            errors.append(f"{name_of(doc)}: worker without --model-path")
        for forbidden in ("--api-key", "--admin-api-key"):
            if any(a == forbidden or a.startswith(forbidden + "=") for a in args):
                errors.append(f"{name_of(doc)}: {forbidden} on the command line (a secret in the manifest)")
    return errors


SECRETISH = ("SECRET", "TOKEN", "PASSWORD", "API_KEY", "APIKEY", "PRIVATE_KEY")


def check_secret_references(docs: list[Doc]) -> list[str]:
    """Secrets only by reference: no Secret objects with data, no secret-looking literal env values."""
    errors = []
    for doc in docs:
        if doc.get("kind") == "Secret" and (doc.get("data") or doc.get("stringData")):
            errors.append(f"{name_of(doc)}: Secret with inline data/stringData in the manifests")
        if doc.get("kind") == "ConfigMap":
            blob = yaml.safe_dump(doc.get("data") or {}) + yaml.safe_dump(doc.get("binaryData") or {})
            for marker in ("key_sha256", "namespace_secret"):
                if marker in blob:
                    errors.append(f"{name_of(doc)}: ConfigMap carries tenants-file content ({marker})")
        spec = pod_spec(doc)
        if spec is None:
            continue
        for c in containers(spec):
            for env in c.get("env") or []:
                upper = str(env.get("name", "")).upper()
                if "value" in env and any(word in upper for word in SECRETISH):
                    errors.append(f"{name_of(doc)} container {c.get('name')}: env {env['name']} is a literal")
                ref = env.get("valueFrom") or {}
                if "value" not in env and not ref:
                    errors.append(f"{name_of(doc)} container {c.get('name')}: env {env.get('name')} has no value")
    return errors


def check_tenants_mount(doc: Doc, secret_name: str = TENANTS_SECRET) -> list[str]:
    """The tenants file comes from a Secret volume, mounted read-only at TENANTS_MOUNT."""
    spec = pod_spec(doc) or {}
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    errors = []
    for c in spec.get("containers") or []:
        mounts = [m for m in c.get("volumeMounts") or [] if m.get("mountPath") == TENANTS_MOUNT]
        if not mounts:
            errors.append(f"{name_of(doc)}: nothing mounted at {TENANTS_MOUNT}")
            continue
        mount = mounts[0]
        if mount.get("readOnly") is not True:
            errors.append(f"{name_of(doc)}: {TENANTS_MOUNT} is not mounted readOnly")
        secret = (volumes.get(mount.get("name")) or {}).get("secret")
        if not secret:
            errors.append(f"{name_of(doc)}: {TENANTS_MOUNT} is not a Secret volume")
        elif secret.get("secretName") != secret_name:
            errors.append(f"{name_of(doc)}: tenants Secret is {secret.get('secretName')!r}, want {secret_name!r}")
        elif secret.get("optional"):
            errors.append(f"{name_of(doc)}: the tenants Secret must not be optional")
    return errors


def check_network_policy(docs: list[Doc], worker: Doc, router: Doc, *, pd: bool = False) -> list[str]:
    """A NetworkPolicy selects the worker pods and admits, on the server port only, the router pods
    (plus Prometheus pods from a namespace labelled for it); nothing else. With ``pd``, also worker pods
    (prefill and decode pools: bootstrap and KV transfer), on TCP ports only."""
    worker_labels, router_labels = pod_labels(worker), pod_labels(router)
    policies = [
        d
        for d in docs
        if d.get("kind") == "NetworkPolicy" and selects((d.get("spec") or {}).get("podSelector"), worker_labels)
    ]
    if not policies:
        return ["no NetworkPolicy selects the worker pods"]
    errors = []
    for pol in policies:
        spec = pol.get("spec") or {}
        if "Ingress" not in (spec.get("policyTypes") or ["Ingress"]):
            errors.append(f"{name_of(pol)}: policyTypes lacks Ingress")
        rules = spec.get("ingress") or []
        for i, rule in enumerate(rules):
            where = f"{name_of(pol)} ingress[{i}]"
            ports = rule.get("ports") or []
            if not ports:
                errors.append(f"{where}: all ports allowed")
            peers_of_pd = [p.get("podSelector") for p in rule.get("from") or [] if set(p) == {"podSelector"}]
            worker_peers = [sel for sel in peers_of_pd if selects(sel, worker_labels)]
            if pd and worker_peers and len(worker_peers) == len(rule["from"]):
                for pod_sel in worker_peers:
                    if selects(pod_sel, router_labels):
                        errors.append(f"{where}: PD peer {pod_sel} is not (only) the worker pods")
                errors += [f"{where}: PD port {p} is not TCP" for p in ports if p.get("protocol", "TCP") != "TCP"]
                continue
            for port in ports:
                if port.get("port") not in (SERVER_PORT, "http") or port.get("protocol", "TCP") != "TCP":
                    errors.append(f"{where}: port {port} is not the server port")
            peers = rule.get("from")
            if not peers:
                errors.append(f"{where}: allows every source")
                continue
            for peer in peers:
                if "ipBlock" in peer:
                    errors.append(f"{where}: ipBlock peer")
                    continue
                pod_sel = peer.get("podSelector")
                ns_sel = peer.get("namespaceSelector")
                if ns_sel is None:
                    if not pod_sel or not (pod_sel.get("matchLabels") or pod_sel.get("matchExpressions")):
                        errors.append(f"{where}: peer selects every pod of the namespace")
                    elif not selects(pod_sel, router_labels) or selects(pod_sel, worker_labels):
                        errors.append(f"{where}: peer {pod_sel} is not (only) the router pods")
                    continue
                ns_labels = ns_sel.get("matchLabels") or {}
                pod_match = (pod_sel or {}).get("matchLabels") or {}
                if (
                    ns_labels.get(PROMETHEUS_NS_LABEL) != "true"
                    or pod_match.get("app.kubernetes.io/name") != "prometheus"
                ):
                    errors.append(f"{where}: cross-namespace peer {peer} is not the labelled Prometheus")
    return errors


def image_ok(image: str) -> bool:
    if "@sha256:" in image:
        return True
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return False
    tag = last.rsplit(":", 1)[1]
    return bool(tag) and tag != "latest"


def check_images(doc: Doc) -> list[str]:
    """Images pinned by an explicit tag (or digest): never untagged, never :latest."""
    spec = pod_spec(doc)
    if spec is None:
        return []
    errors = []
    for c in containers(spec):
        image = c.get("image") or ""
        if not image_ok(image):
            errors.append(f"{name_of(doc)} container {c.get('name')}: image {image!r} is not pinned by a tag")
        if c.get("imagePullPolicy") == "Always" and not image_ok(image):
            errors.append(f"{name_of(doc)} container {c.get('name')}: pulls a floating image")
    return errors


def check_security_context(doc: Doc) -> list[str]:
    """Non-root (non-zero uid), no privilege escalation, all capabilities dropped, read-only root
    file system with writable emptyDirs for /tmp; no host namespaces."""
    spec = pod_spec(doc)
    if spec is None:
        return []
    errors = []
    pod_sc = spec.get("securityContext") or {}
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(host):
            errors.append(f"{name_of(doc)}: {host}")
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    for c in containers(spec):
        where = f"{name_of(doc)} container {c.get('name')}"
        sc = c.get("securityContext") or {}
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
        if non_root is not True:
            errors.append(f"{where}: runAsNonRoot is not true")
        if not isinstance(uid, int) or uid <= 0:
            errors.append(f"{where}: runAsUser {uid!r} is not a non-zero uid")
        if sc.get("allowPrivilegeEscalation") is not False:
            errors.append(f"{where}: allowPrivilegeEscalation is not false")
        if sc.get("privileged"):
            errors.append(f"{where}: privileged")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            errors.append(f"{where}: capabilities do not drop ALL")
        if caps.get("add"):
            errors.append(f"{where}: adds capabilities {caps['add']}")
        if sc.get("readOnlyRootFilesystem") is not True:
            errors.append(f"{where}: readOnlyRootFilesystem is not true")
        else:
            tmp = [m for m in c.get("volumeMounts") or [] if m.get("mountPath") == "/tmp"]
            if not tmp or "emptyDir" not in (volumes.get(tmp[0].get("name")) or {}) or tmp[0].get("readOnly"):
                errors.append(f"{where}: read-only root without a writable emptyDir at /tmp")
    return errors


def check_gpu_resources(doc: Doc, require_gpu: bool) -> list[str]:
    """nvidia.com/gpu: requests == limits wherever it appears; present on the worker when required."""
    spec = pod_spec(doc)
    if spec is None:
        return []
    errors = []
    for c in containers(spec):
        res = c.get("resources") or {}
        req = (res.get("requests") or {}).get(GPU)
        lim = (res.get("limits") or {}).get(GPU)
        if (req is not None or lim is not None) and str(req) != str(lim):
            errors.append(f"{name_of(doc)} container {c.get('name')}: {GPU} requests {req!r} != limits {lim!r}")
    if require_gpu:
        main = spec.get("containers") or []
        if not main or not all(((c.get("resources") or {}).get("limits") or {}).get(GPU) for c in main):
            errors.append(f"{name_of(doc)}: no {GPU} limit on the worker")
    return errors


def check_no_gpu(doc: Doc) -> list[str]:
    spec = pod_spec(doc) or {}
    errors = []
    for c in containers(spec):
        res = c.get("resources") or {}
        if GPU in (res.get("requests") or {}) or GPU in (res.get("limits") or {}):
            errors.append(f"{name_of(doc)} container {c.get('name')}: asks for {GPU}")
    return errors


def check_dev_shm(doc: Doc) -> list[str]:
    """/dev/shm is a memory-backed emptyDir in every worker container."""
    spec = pod_spec(doc) or {}
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    errors = []
    for c in spec.get("containers") or []:
        shm = [m for m in c.get("volumeMounts") or [] if m.get("mountPath") == "/dev/shm"]
        vol = volumes.get(shm[0].get("name")) if shm else None
        if not vol or (vol.get("emptyDir") or {}).get("medium") != "Memory":
            errors.append(f"{name_of(doc)} container {c.get('name')}: /dev/shm is not an emptyDir medium Memory")
    return errors


def check_hpa(docs: list[Doc], worker: Doc) -> list[str]:
    """An autoscaling/v2 HPA scales the worker StatefulSet on the queue-length Pods metric."""
    hpas = [d for d in docs if d.get("kind") == "HorizontalPodAutoscaler"]
    if not hpas:
        return ["no HorizontalPodAutoscaler"]
    errors = []
    for hpa in hpas:
        spec = hpa.get("spec") or {}
        ref = spec.get("scaleTargetRef") or {}
        if hpa.get("apiVersion") != "autoscaling/v2":
            errors.append(f"{name_of(hpa)}: apiVersion {hpa.get('apiVersion')}")
        if (ref.get("apiVersion"), ref.get("kind"), ref.get("name")) != (
            "apps/v1",
            "StatefulSet",
            worker["metadata"]["name"],
        ):
            errors.append(f"{name_of(hpa)}: targets {ref}, not the worker StatefulSet")
        names = [
            ((m.get("pods") or {}).get("metric") or {}).get("name")
            for m in spec.get("metrics") or []
            if m.get("type") == "Pods"
        ]
        if QUEUE_METRIC not in names:
            errors.append(f"{name_of(hpa)}: no Pods metric {QUEUE_METRIC}")
        if spec.get("minReplicas", 1) < 1 or spec.get("maxReplicas", 0) < spec.get("minReplicas", 1):
            errors.append(f"{name_of(hpa)}: bad replica bounds")
    return errors


def check_pdbs(docs: list[Doc], workloads: list[Doc]) -> list[str]:
    """Each workload's pods are covered by a PodDisruptionBudget."""
    pdbs = [d for d in docs if d.get("kind") == "PodDisruptionBudget"]
    errors = []
    for w in workloads:
        if not any(selects((p.get("spec") or {}).get("selector"), pod_labels(w)) for p in pdbs):
            errors.append(f"{name_of(w)}: no PodDisruptionBudget selects its pods")
    return errors


def check_router(doc: Doc) -> list[str]:
    """The router runs a routing policy without a cross-tenant prompt structure (never cache_aware)."""
    spec = pod_spec(doc) or {}
    errors = []
    for c in spec.get("containers") or []:
        args = container_args(c)
        launches = any("sglang_router" in a for a in args) or args[:2] == ["sglang-iso", "router"]
        if not launches:
            errors.append(f"{name_of(doc)}: does not launch sglang_router")
        policy = flag_value(args, "--policy")
        if policy not in ALLOWED_ROUTER_POLICIES:
            # The router's default is cache_aware: the policy must be explicit.
            errors.append(f"{name_of(doc)}: --policy {policy!r} (allowed: {sorted(ALLOWED_ROUTER_POLICIES)})")
        for a in args:
            if "cache_aware" in a:
                errors.append(f"{name_of(doc)}: mentions cache_aware in {a!r}")
        if any(a == "--api-key" or a.startswith("--api-key=") for a in args):
            errors.append(f"{name_of(doc)}: --api-key literal on the command line")
    return errors


def check_worker_services(docs: list[Doc], worker: Doc) -> list[str]:
    """The StatefulSet's serviceName is a headless Service that selects the worker pods, and a
    ServiceMonitor scrapes /metrics from it."""
    errors = []
    svc_name = (worker.get("spec") or {}).get("serviceName")
    services = [d for d in docs if d.get("kind") == "Service" and d["metadata"].get("name") == svc_name]
    if not services:
        return [f"{name_of(worker)}: serviceName {svc_name!r} has no Service"]
    svc = services[0]
    if (svc.get("spec") or {}).get("clusterIP") != "None":
        errors.append(f"{name_of(svc)}: not headless")
    if not (svc.get("spec") or {}).get("selector") or not selects(
        {"matchLabels": svc["spec"]["selector"]}, pod_labels(worker)
    ):
        errors.append(f"{name_of(svc)}: does not select the worker pods")
    monitors = [d for d in docs if d.get("kind") == "ServiceMonitor"]
    if not monitors:
        errors.append("no ServiceMonitor")
    for mon in monitors:
        spec = mon.get("spec") or {}
        if mon.get("apiVersion") != "monitoring.coreos.com/v1":
            errors.append(f"{name_of(mon)}: apiVersion {mon.get('apiVersion')}")
        if not selects(spec.get("selector"), (svc.get("metadata") or {}).get("labels") or {}):
            errors.append(f"{name_of(mon)}: does not select the worker Service")
        port_names = {p.get("name") for p in (svc.get("spec") or {}).get("ports") or []}
        for ep in spec.get("endpoints") or [{}]:
            if ep.get("path", "/metrics") != "/metrics" or ep.get("port") not in port_names:
                errors.append(f"{name_of(mon)}: endpoint {ep} is not /metrics on a worker Service port")
    return errors


# --------------------------------------------------------------------------------------------
# Rendering


def kustomize(target: Path) -> list[Doc]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed (needed to render deploy/ with kustomize)")
    out = subprocess.run([KUBECTL, "kustomize", str(target)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"kubectl kustomize {target} failed:\n{out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


# Ids are "<overlay>-overlay": a bare "gpu" keyword would make test/conftest.py skip the test as
# needing CUDA.
@pytest.fixture(scope="module", params=OVERLAYS, ids=[f"{o}-overlay" for o in OVERLAYS])
def overlay(request: pytest.FixtureRequest) -> str:
    return str(request.param)


_RENDERED: dict[str, list[Doc]] = {}


@pytest.fixture()
def docs(overlay: str) -> list[Doc]:
    if overlay not in _RENDERED:
        _RENDERED[overlay] = kustomize(DEPLOY / "overlays" / overlay)
    return copy.deepcopy(_RENDERED[overlay])


@pytest.fixture()
def worker(docs: list[Doc]) -> Doc:
    return find(docs, "StatefulSet", WORKER_NAME)


@pytest.fixture()
def router(docs: list[Doc]) -> Doc:
    return find(docs, "Deployment", ROUTER_NAME)


def tool(name: str) -> Path:
    path = BIN / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            pytest.skip(f"{name} is not installed (pip install -r requirements/deploy.txt)")
        path = Path(found)
    return path


def kubernetes_validate(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    versions = [arg for v in K8S_VERSIONS for arg in ("-k", v)]
    return subprocess.run(
        [str(tool("kubernetes-validate")), "--strict", *versions, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=300,
    )


# --------------------------------------------------------------------------------------------
# The rendered overlays


def test_overlay_renders_expected_objects(docs: list[Doc]) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for expected in [
        ("Deployment", ROUTER_NAME),
        ("Service", ROUTER_NAME),
        ("StatefulSet", WORKER_NAME),
        ("Service", WORKER_NAME),
        ("NetworkPolicy", WORKER_NAME),
        ("PodDisruptionBudget", ROUTER_NAME),
        ("PodDisruptionBudget", WORKER_NAME),
        ("HorizontalPodAutoscaler", WORKER_NAME),
        ("ServiceMonitor", WORKER_NAME),
        ("PrometheusRule", "sglang-iso-alerts"),
    ]:
        assert expected in kinds, f"{expected} missing; rendered: {sorted(kinds)}"


def test_schema_strict(docs: list[Doc], overlay: str, tmp_path: Path) -> None:
    builtin = [d for d in docs if (d.get("apiVersion"), d.get("kind")) not in CRD_KINDS]
    assert builtin
    paths = []
    for i, doc in enumerate(builtin):
        path = tmp_path / f"{i:02d}-{doc['kind']}-{doc['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(doc))
        paths.append(path)
    out = kubernetes_validate(paths)
    assert out.returncode == 0, f"{overlay}:\n{out.stdout}{out.stderr}"
    # A document without a schema only warns: require an explicit pass for every one.
    passed = out.stdout.count(" passed for resource ")
    assert passed == len(builtin) * len(K8S_VERSIONS), out.stdout


def test_yamllint() -> None:
    out = subprocess.run(
        [str(tool("yamllint")), "--strict", "-c", str(DEPLOY / ".yamllint"), str(DEPLOY)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_probes(docs: list[Doc]) -> None:
    assert [e for d in docs for e in check_probes(d)] == []


def test_worker_probes(worker: Doc, overlay: str) -> None:
    assert check_worker_probes(worker, STARTUP_BUDGET_S[overlay]) == []


def test_worker_args(worker: Doc) -> None:
    assert check_worker_args(worker) == []


def test_secrets_only_by_reference(docs: list[Doc], worker: Doc) -> None:
    assert check_secret_references(docs) == []
    assert check_tenants_mount(worker) == []


def test_network_policy(docs: list[Doc], worker: Doc, router: Doc, overlay: str) -> None:
    assert check_network_policy(docs, worker, router, pd=overlay == "pd") == []


def test_images_pinned(docs: list[Doc]) -> None:
    assert [e for d in docs for e in check_images(d)] == []


def test_security_context(docs: list[Doc]) -> None:
    workloads = [d for d in docs if pod_spec(d) is not None]
    assert len(workloads) >= 2
    assert [e for d in workloads for e in check_security_context(d)] == []


def test_gpu_resources(docs: list[Doc], worker: Doc, overlay: str) -> None:
    assert [e for d in docs for e in check_gpu_resources(d, require_gpu=False)] == []
    if overlay in GPU_OVERLAYS:
        assert check_gpu_resources(worker, require_gpu=True) == []
    else:
        assert [e for d in docs for e in check_no_gpu(d)] == []


def test_dev_shm(worker: Doc) -> None:
    assert check_dev_shm(worker) == []


def test_hpa(docs: list[Doc], worker: Doc) -> None:
    assert check_hpa(docs, worker) == []


def test_pdbs(docs: list[Doc], worker: Doc, router: Doc) -> None:
    assert check_pdbs(docs, [worker, router]) == []


def test_router(router: Doc) -> None:
    assert check_router(router) == []


def test_worker_services(docs: list[Doc], worker: Doc) -> None:
    assert check_worker_services(docs, worker) == []


def selector_args(args: list[str], flag: str) -> dict[str, str]:
    """``--prefill-selector k=v k=v ...`` (up to the next flag) as a label map."""
    if flag not in args:
        return {}
    values = list(itertools.takewhile(lambda a: not a.startswith("--"), args[args.index(flag) + 1 :]))
    return dict(v.split("=", 1) for v in values)


def test_pd_overlay_pools_router_and_transfer_path() -> None:
    """Prefill and decode pools the launcher accepts as they are, a PD router that finds each pool (and only it),
    holds the router key by reference, and workers that reach each other for bootstrap and transfer."""
    from sglang_iso.server.args import plan_launch

    docs = kustomize(DEPLOY / "overlays" / "pd")
    prefill, decode = find(docs, "StatefulSet", WORKER_NAME), find(docs, "StatefulSet", WORKER_NAME + "-decode")
    router = find(docs, "Deployment", ROUTER_NAME)
    p_labels, d_labels = pod_labels(prefill), pod_labels(decode)
    assert not selects(prefill["spec"]["selector"], d_labels) and not selects(decode["spec"]["selector"], p_labels)
    for pool, mode in ((prefill, "prefill"), (decode, "decode")):
        args = container_args(containers(pod_spec(pool) or {})[0])
        plan = plan_launch(args, cuda_available=True, env={})  # raises on anything the coverage table refuses
        assert flag_value(plan.sglang_argv, "--disaggregation-mode") == mode
        assert check_worker_args(pool) == [] and check_tenants_mount(pool) == []
        assert check_gpu_resources(pool, require_gpu=True) == []
        env = {e["name"]: e for e in containers(pod_spec(pool) or {})[0].get("env") or []}
        assert env["SGLANG_HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    p_args = container_args(containers(pod_spec(prefill) or {})[0])
    port = flag_value(p_args, "--disaggregation-bootstrap-port")
    assert prefill["spec"]["template"]["metadata"]["annotations"]["sglang.ai/bootstrap-port"] == port
    r_args = container_args(containers(pod_spec(router) or {})[0])
    assert "--pd-disaggregation" in r_args and check_router(router) == []
    p_sel, d_sel = selector_args(r_args, "--prefill-selector"), selector_args(r_args, "--decode-selector")
    assert selects({"matchLabels": p_sel}, p_labels) and not selects({"matchLabels": p_sel}, d_labels)
    assert selects({"matchLabels": d_sel}, d_labels) and not selects({"matchLabels": d_sel}, p_labels)
    assert (flag_value(r_args, "--tenants-file") or "").startswith(TENANTS_MOUNT + "/")
    assert check_tenants_mount(router) == []
    r_env = {e["name"]: e for e in containers(pod_spec(router) or {})[0].get("env") or []}
    assert "secretKeyRef" in r_env["SGLANG_ISO_ROUTER_KEY"]["valueFrom"]  # the router key, by reference only
    assert check_secret_references(docs) == []
    peers = [
        (rule, peer)
        for d in docs
        if d["kind"] == "NetworkPolicy" and selects(d["spec"]["podSelector"], d_labels)
        for rule in d["spec"].get("ingress") or []
        for peer in rule.get("from") or []
        if selects(peer.get("podSelector"), p_labels) and "namespaceSelector" not in peer
    ]
    assert any(int(port) in [p.get("port") for p in rule.get("ports") or []] for rule, _ in peers), peers
    assert check_network_policy(docs, prefill, router, pd=True) == []
    assert check_network_policy(docs, prefill, router) != []  # control: without pd, worker peers are refused


def test_no_secret_files_committed() -> None:
    """The operator's tenants file and secret never live in deploy/."""
    suspicious = [
        p.relative_to(ROOT)
        for p in DEPLOY.rglob("*")
        if p.is_file() and (p.name == "tenants.toml" or p.suffix in (".key", ".pem") or p.name.startswith(".env"))
    ]
    assert suspicious == []


def test_existing_secret_patch_from_readme(tmp_path: Path) -> None:
    """The README's recipe for an operator-created Secret with another name renders and takes effect."""
    readme = (DEPLOY / "README.md").read_text()
    start = readme.index("<!-- existing-secret-kustomization -->")
    block = readme[start:].split("```yaml\n", 1)[1].split("```", 1)[0]
    assert "../gpu" in block
    # The README's overlay sits in deploy/overlays/<site>/; here it sits in a temporary directory.
    # kustomize wants a relative path for a directory resource.
    gpu = os.path.relpath(DEPLOY / "overlays" / "gpu", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(block.replace("../gpu", gpu))
    worker = find(kustomize(tmp_path), "StatefulSet", WORKER_NAME)
    assert check_tenants_mount(worker, secret_name="my-tenants") == []
    assert check_tenants_mount(worker)  # the default name is gone


# --------------------------------------------------------------------------------------------
# The rules themselves fail on bad manifests


def good_worker() -> Doc:
    sc = {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": WORKER_NAME},
        "spec": {
            "serviceName": WORKER_NAME,
            "selector": {"matchLabels": {"app": "w"}},
            "template": {
                "metadata": {"labels": {"app": "w"}},
                "spec": {
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
                    "containers": [
                        {
                            "name": "worker",
                            "image": "ghcr.io/example/sglang-iso:0.1.0",
                            "args": [
                                "--host=0.0.0.0",
                                "--port=30000",
                                "--model-path=/m",
                                f"--tenants-file={TENANTS_MOUNT}/tenants.toml",
                                "--enable-metrics",
                            ],
                            "startupProbe": {
                                "httpGet": {"path": "/health_generate"},
                                "periodSeconds": 10,
                                "failureThreshold": 90,
                            },
                            "readinessProbe": {"httpGet": {"path": "/health_generate"}},
                            "livenessProbe": {"httpGet": {"path": "/health"}},
                            "resources": {"requests": {GPU: "1"}, "limits": {GPU: "1"}},
                            "securityContext": sc,
                            "volumeMounts": [
                                {"name": "tenants", "mountPath": TENANTS_MOUNT, "readOnly": True},
                                {"name": "tmp", "mountPath": "/tmp"},
                                {"name": "dshm", "mountPath": "/dev/shm"},
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "tenants", "secret": {"secretName": TENANTS_SECRET}},
                        {"name": "tmp", "emptyDir": {}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
                    ],
                },
            },
        },
    }


def good_router() -> Doc:
    doc = good_worker()
    doc["kind"] = "Deployment"
    doc["metadata"]["name"] = ROUTER_NAME
    spec = doc["spec"]
    spec.pop("serviceName")
    spec["selector"] = {"matchLabels": {"app": "r"}}
    spec["template"]["metadata"]["labels"] = {"app": "r"}
    c = spec["template"]["spec"]["containers"][0]
    c["name"] = "router"
    c["args"] = ["-m", "sglang_router.launch_router", "--policy=manual"]
    return doc


def good_policy() -> Doc:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "p"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "w"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"app": "r"}}}], "ports": [{"port": SERVER_PORT}]},
                {
                    "from": [
                        {
                            "namespaceSelector": {"matchLabels": {PROMETHEUS_NS_LABEL: "true"}},
                            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
                        }
                    ],
                    "ports": [{"port": SERVER_PORT, "protocol": "TCP"}],
                },
            ],
        },
    }


def w_container(doc: Doc) -> Doc:
    return doc["spec"]["template"]["spec"]["containers"][0]


def w_spec(doc: Doc) -> Doc:
    return doc["spec"]["template"]["spec"]


def test_rules_accept_the_good_fixtures() -> None:
    w, r = good_worker(), good_router()
    assert check_probes(w) == []
    assert check_worker_probes(w, 900) == []
    assert check_worker_args(w) == []
    assert check_secret_references([w, r]) == []
    assert check_tenants_mount(w) == []
    assert check_network_policy([good_policy()], w, r) == []
    assert check_images(w) == []
    assert check_security_context(w) == []
    assert check_gpu_resources(w, require_gpu=True) == []
    assert check_dev_shm(w) == []
    assert check_router(r) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("startupProbe", None),
        ("readinessProbe", {"httpGet": {"path": "/health"}}),
        ("livenessProbe", {"httpGet": {"path": "/health_generate"}}),
        ("startupProbe", {"httpGet": {"path": "/health_generate"}, "periodSeconds": 10, "failureThreshold": 30}),
    ],
)
def test_worker_probe_rule_fails(path: str, value: Any) -> None:
    w = good_worker()
    if value is None:
        del w_container(w)[path]
    else:
        w_container(w)[path] = value
    assert check_worker_probes(w, 900)
    if value is None:
        assert check_probes(w)


@pytest.mark.parametrize(
    "args",
    [
        ["--port=30000", "--model-path=/m", "--tenants-file=/etc/sglang-iso/t.toml", "--enable-metrics"],
        ["--host=0.0.0.0", "--model-path=/m", "--tenants-file=/etc/sglang-iso/t.toml"],
        ["--host=0.0.0.0", "--model-path=/m", "--tenants-file=/tmp/t.toml", "--enable-metrics"],
        ["--host", "0.0.0.0", "--model-path", "/m", "--enable-metrics"],
        ["--host=0.0.0.0", "--model-path=/m", "--tenants-file=/etc/sglang-iso/t", "--enable-metrics", "--api-key=x"],
    ],
)
def test_worker_args_rule_fails(args: list[str]) -> None:
    w = good_worker()
    w_container(w)["args"] = args
    assert check_worker_args(w)


def test_secret_rules_fail() -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "stringData": {"tenants.toml": "x"}}
    assert check_secret_references([secret])
    secret_b64 = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"secret.key": "eA=="}}
    assert check_secret_references([secret_b64])
    cm = {"kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"t.toml": 'key_sha256 = ["ab"]'}}
    assert check_secret_references([cm])
    w = good_worker()
    w_container(w)["env"] = [{"name": "SGLANG_ISO_SECRET", "value": "0123456789abcdef0123456789abcdef"}]
    assert check_secret_references([w])
    w_container(w)["env"] = [
        {"name": "SGLANG_ISO_SECRET", "valueFrom": {"secretKeyRef": {"name": TENANTS_SECRET, "key": "secret.key"}}}
    ]
    assert check_secret_references([w]) == []
    # The tenants file: not read-only, not a Secret, wrong Secret, or not mounted at all.
    for mutate in (
        lambda d: w_container(d)["volumeMounts"][0].update(readOnly=False),
        lambda d: w_spec(d)["volumes"][0].update(secret=None, configMap={"name": "c"}),
        lambda d: w_spec(d)["volumes"][0]["secret"].update(secretName="other"),
        lambda d: w_spec(d)["volumes"][0]["secret"].update(optional=True),
        lambda d: w_container(d)["volumeMounts"].pop(0),
    ):
        bad = good_worker()
        mutate(bad)
        assert check_tenants_mount(bad), mutate


def test_network_policy_rule_fails() -> None:
    w, r = good_worker(), good_router()
    assert check_network_policy([], w, r)  # none at all
    cases = []
    pol = good_policy()
    pol["spec"]["podSelector"] = {"matchLabels": {"app": "other"}}
    cases.append(pol)
    pol = good_policy()
    pol["spec"]["ingress"][0]["from"] = []  # everyone
    cases.append(pol)
    pol = good_policy()
    pol["spec"]["ingress"][0]["from"] = [{"podSelector": {}}]  # every pod of the namespace
    cases.append(pol)
    pol = good_policy()
    pol["spec"]["ingress"][0]["from"] = [{"podSelector": {"matchLabels": {"app": "w"}}}]  # workers, not router
    cases.append(pol)
    pol = good_policy()
    pol["spec"]["ingress"][0]["from"] = [{"ipBlock": {"cidr": "0.0.0.0/0"}}]
    cases.append(pol)
    pol = good_policy()
    pol["spec"]["ingress"][0]["ports"] = [{"port": 22}]
    cases.append(pol)
    pol = good_policy()
    del pol["spec"]["ingress"][0]["ports"]
    cases.append(pol)
    pol = good_policy()
    pol["spec"]["ingress"][1]["from"][0]["namespaceSelector"] = {}  # Prometheus from any namespace
    cases.append(pol)
    pol = good_policy()
    pol["spec"]["ingress"][1]["from"][0]["podSelector"] = {"matchLabels": {"app.kubernetes.io/name": "sglang-iso"}}
    cases.append(pol)
    for i, case in enumerate(cases):
        assert check_network_policy([case], w, r), f"case {i} passed"


@pytest.mark.parametrize(
    "image",
    ["ghcr.io/example/sglang-iso", "ghcr.io/example/sglang-iso:latest", "localhost:5000/sglang-iso", "sglang-iso:"],
)
def test_image_rule_fails(image: str) -> None:
    w = good_worker()
    w_container(w)["image"] = image
    assert check_images(w)


def test_image_rule_accepts_digest_and_registry_port() -> None:
    assert image_ok("ghcr.io/example/sglang-iso@sha256:" + "0" * 64)
    assert image_ok("localhost:5000/sglang-iso:0.1.0")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("runAsNonRoot", False),
        ("runAsUser", 0),
        ("allowPrivilegeEscalation", True),
        ("allowPrivilegeEscalation", None),
        ("readOnlyRootFilesystem", False),
        ("capabilities", {"drop": ["NET_RAW"]}),
        ("capabilities", {"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
        ("privileged", True),
    ],
)
def test_security_context_rule_fails(key: str, value: Any) -> None:
    w = good_worker()
    sc = w_container(w)["securityContext"]
    if value is None:
        del sc[key]
    else:
        sc[key] = value
    if key in ("runAsNonRoot", "runAsUser"):
        w_spec(w)["securityContext"][key] = value
    assert check_security_context(w)


def test_security_context_rule_needs_writable_tmp() -> None:
    w = good_worker()
    w_container(w)["volumeMounts"] = [m for m in w_container(w)["volumeMounts"] if m["mountPath"] != "/tmp"]
    assert check_security_context(w)
    w = good_worker()
    w_spec(w)["hostNetwork"] = True
    assert check_security_context(w)


def test_gpu_rule_fails() -> None:
    w = good_worker()
    w_container(w)["resources"] = {"requests": {GPU: "1"}, "limits": {GPU: "2"}}
    assert check_gpu_resources(w, require_gpu=False)
    w_container(w)["resources"] = {"limits": {"memory": "1Gi"}}
    assert check_gpu_resources(w, require_gpu=True)
    assert check_no_gpu(good_worker())


def test_shm_rule_fails() -> None:
    w = good_worker()
    w_spec(w)["volumes"][2] = {"name": "dshm", "emptyDir": {}}
    assert check_dev_shm(w)
    w = good_worker()
    w_container(w)["volumeMounts"].pop()
    assert check_dev_shm(w)


def test_hpa_rule_fails() -> None:
    w = good_worker()
    assert check_hpa([], w)
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "h"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": WORKER_NAME},
            "minReplicas": 1,
            "maxReplicas": 4,
            "metrics": [{"type": "Pods", "pods": {"metric": {"name": QUEUE_METRIC}}}],
        },
    }
    assert check_hpa([hpa], w) == []
    for mutate in (
        lambda h: h["spec"]["scaleTargetRef"].update(kind="Deployment"),
        lambda h: h["spec"]["scaleTargetRef"].update(name="other"),
        lambda h: h.update(apiVersion="autoscaling/v1"),
        lambda h: h["spec"].update(metrics=[{"type": "Resource", "resource": {"name": "cpu"}}]),
    ):
        bad = copy.deepcopy(hpa)
        mutate(bad)
        assert check_hpa([bad], w), mutate


def test_pdb_rule_fails() -> None:
    w, r = good_worker(), good_router()
    pdb = {
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "p"},
        "spec": {"selector": {"matchLabels": {"app": "w"}}},
    }
    assert check_pdbs([pdb], [w]) == []
    assert check_pdbs([pdb], [w, r])


@pytest.mark.parametrize(
    "args",
    [
        ["-m", "sglang_router.launch_router"],  # default policy is cache_aware
        ["-m", "sglang_router.launch_router", "--policy=cache_aware"],
        ["-m", "sglang_router.launch_router", "--policy", "cache_aware"],
        ["-m", "sglang_router.launch_router", "--policy=manual", "--prefill-policy=cache_aware"],
        ["-m", "sglang_router.launch_router", "--policy=power_of_two"],
        ["-m", "sglang_router.launch_router", "--policy=manual", "--api-key=sk-admin"],
    ],
)
def test_router_rule_fails(args: list[str]) -> None:
    r = good_router()
    w_container(r)["args"] = args
    assert check_router(r)


def test_worker_service_rule_fails() -> None:
    w = good_worker()
    assert check_worker_services([], w)
    svc = {
        "kind": "Service",
        "metadata": {"name": WORKER_NAME, "labels": {"c": "w"}},
        "spec": {"clusterIP": "10.0.0.1", "selector": {"app": "w"}, "ports": [{"name": "http", "port": 30000}]},
    }
    mon = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "m"},
        "spec": {"selector": {"matchLabels": {"c": "w"}}, "endpoints": [{"port": "http", "path": "/metrics"}]},
    }
    assert check_worker_services([svc, mon], w)  # not headless
    svc["spec"]["clusterIP"] = "None"
    assert check_worker_services([svc, mon], w) == []
    mon["spec"]["endpoints"] = [{"port": "metrics"}]
    assert check_worker_services([svc, mon], w)


def test_kubernetes_validate_rejects_unknown_fields(tmp_path: Path) -> None:
    bad = good_worker()
    w_container(bad)["livenessProbe"]["httpGet"]["port"] = 30000
    w_container(bad)["readinessProbe"]["httpGet"]["port"] = 30000
    w_container(bad)["startupProbe"]["httpGet"]["port"] = 30000
    w_container(bad)["notAField"] = True
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    out = kubernetes_validate([path])
    assert out.returncode != 0, out.stdout
    del w_container(bad)["notAField"]
    path.write_text(yaml.safe_dump(bad))
    out = kubernetes_validate([path])
    assert out.returncode == 0, out.stdout


def test_yamllint_config_rejects_bad_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: yes\nb:   [1,2]\nc: 1\nc: 2\n")
    out = subprocess.run(
        [str(tool("yamllint")), "--strict", "-c", str(DEPLOY / ".yamllint"), str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0, out.stdout
