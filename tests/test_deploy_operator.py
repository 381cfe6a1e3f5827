"""specload under Locust's Kubernetes operator (docs/deploy/locust-operator/, docs/deploy.md).

The LocustTest is checked against the operator's published CRD (locustio/k8s-operator,
charts/locust-operator/crds/locusttest.yaml, locust.cloud/v1): no registry package (PyPI, npm) ships
that schema, so its structure is checked here field by field, as the schema states it. Then the pods
are rendered as the operator renders them (``--master`` + the args split as a shell would; ``--worker
--master-host <name>-master`` + the same args) and the entrypoint's specload command lines parse with
specload's own parsers; the master token comes from a Secret, read with the pod's service account
from an API server (here a local one). No cluster, no network beyond 127.0.0.1.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import shlex
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.test_deploy import GUIDE, IMAGE, K8S, code_blocks, one, parse

OPERATOR = Path(__file__).resolve().parent.parent / "docs" / "deploy" / "locust-operator"

# The CRD's spec (v1): every property it declares, and the types it gives them.
SPEC_FIELDS = {
    "annotations",
    "labels",
    "image",
    "imagePullPolicy",
    "imagePullSecrets",
    "workers",
    "args",
    "env",
    "master",
    "worker",
    "locustfile",
    "metrics",
}
POD_FIELDS = {"labels", "annotations", "resources"}


def _entry() -> ModuleType:
    spec = importlib.util.spec_from_file_location("operator_entry", OPERATOR / "operator-entry.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


entry = _entry()


def locusttest() -> dict[str, Any]:
    (doc,) = list(yaml.safe_load_all((OPERATOR / "locusttest.yaml").read_text()))
    return dict(doc)


def _string_map(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items())


def test_the_locusttest_has_the_crds_structure() -> None:
    lt = locusttest()
    assert lt["apiVersion"] == "locust.cloud/v1" and lt["kind"] == "LocustTest"
    assert isinstance(lt["metadata"]["name"], str)
    spec = lt["spec"]
    assert set(spec) <= SPEC_FIELDS, set(spec) - SPEC_FIELDS
    assert isinstance(spec["workers"], int) and spec["workers"] >= 1  # required, minimum 1
    assert isinstance(spec["image"], str) and IMAGE.match(spec["image"])
    assert isinstance(spec["args"], str)  # a string, split by the operator as a shell would
    for var in spec["env"]:  # items: {name, value}, name required; no valueFrom (pruned by the server)
        assert set(var) <= {"name", "value"} and isinstance(var["name"], str), var
        assert isinstance(var.get("value", ""), str), var
    for role in ("master", "worker"):
        pod = spec[role]
        assert set(pod) <= POD_FIELDS, pod
        assert _string_map(pod.get("labels", {})) and _string_map(pod.get("annotations", {}))
        resources = pod["resources"]
        assert set(resources) <= {"requests", "limits"}
        for values in resources.values():
            assert all(isinstance(v, str | int) for v in values.values()), values
    # oneOf: content, or configMap with a name
    locustfile = spec["locustfile"]
    assert len({"content", "configMap"} & set(locustfile)) == 1 and set(locustfile) <= {
        "content",
        "configMap",
    }
    assert isinstance(locustfile["configMap"]["name"], str)


def _pods(lt: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The master's and a worker's container args, as locust_operator/objects.py builds them."""
    args = shlex.split(lt["spec"]["args"])
    return ["--master", *args], ["--worker", "--master-host", f"{lt['metadata']['name']}-master", *args]


def test_the_operators_pods_run_specloads_sweep_and_workers() -> None:
    lt = locusttest()
    master_args, worker_args = _pods(lt)
    master = entry.specload_argv(master_args)
    worker = entry.specload_argv(worker_args)
    sweep = parse(master, "locusttest.yaml (master)")
    parse(worker, "locusttest.yaml (worker)")
    assert sweep is not None and worker == [
        "worker",
        "--master-host",
        "specload-master",
        "--master-port",
        "5557",
    ]
    assert sweep.workers == lt["spec"]["workers"]  # the master waits for as many workers as the Job makes
    assert master[master.index("--master-bind-port") + 1] == "5557"  # the operator's Service port
    # the scenario: the ConfigMap the operator mounts at /home/locust, the one the plain manifests use
    assert sweep.scenario == "/home/locust/scenario.toml"
    cm = one("ConfigMap", lt["spec"]["locustfile"]["configMap"]["name"])
    assert "scenario.toml" in cm["data"]
    # the existing NetworkPolicy selects these pods (only workers reach the master port)
    policy = one("NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= lt["spec"]["master"]["labels"].items()
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"][0]["podSelector"]["matchLabels"].items() <= lt["spec"]["worker"]["labels"].items()
    # no CPU limit on the workers (a throttled client reports its own latency as the server's)
    assert "cpu" not in lt["spec"]["worker"]["resources"].get("limits", {})


def test_the_entry_refuses_what_it_sets_and_what_the_operator_never_sends() -> None:
    with pytest.raises(entry.EntryError, match="leave --master-bind-port out"):
        entry.specload_argv(["--master", "--master-bind-port=6000"])
    with pytest.raises(entry.EntryError, match="need --workers N"):
        entry.specload_argv(["--master", "--host", "http://h:8000"])
    with pytest.raises(entry.EntryError, match="expected --master ARGS"):
        entry.specload_argv(["--headless"])
    assert entry.main(["--headless"], env={}) == 2


def test_the_secret_and_the_rbac_name_the_same_secret() -> None:
    lt = locusttest()
    secret = next(v["value"] for v in lt["spec"]["env"] if v["name"] == "SPECLOAD_SECRET")
    role, binding = list(yaml.safe_load_all((OPERATOR / "rbac.yaml").read_text()))
    (rule,) = role["rules"]
    assert rule == {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret], "verbs": ["get"]}
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "default"}]
    assert not any("TOKEN" in v["name"] or "KEY" in v["name"] for v in lt["spec"]["env"])  # no literal secret


# ---------------------------------------------------------------- the Secret through the API


class _Api(BaseHTTPRequestHandler):
    secrets: dict[str, dict[str, str]] = {}
    token = "sa-token"
    seen: list[str] = []

    def log_message(self, *_a: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.seen.append(self.path)
        name = self.path.rsplit("/", 1)[1]
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            code, body = 401, {}
        elif name not in self.secrets:
            code, body = 404, {}
        else:
            data = {k: base64.b64encode(v.encode()).decode() for k, v in self.secrets[name].items()}
            code, body = 200, {"kind": "Secret", "data": data}
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    _Api.secrets = {
        "specload-secrets": {"SPECLOAD_MASTER_TOKEN": "t" * 32, "SPECLOAD_API_KEY": "sk-x", "OTHER": "no"}
    }
    _Api.seen = []
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token\n")
    (sa / "namespace").write_text("specload\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", sa
    finally:
        server.shutdown()
        server.server_close()


def test_the_master_token_comes_from_the_secret(api: tuple[str, Path]) -> None:
    url, sa = api
    got = entry.read_secret("specload-secrets", url, sa)
    assert got == {"SPECLOAD_MASTER_TOKEN": "t" * 32, "SPECLOAD_API_KEY": "sk-x"}  # those two keys only
    assert _Api.seen == ["/api/v1/namespaces/specload/secrets/specload-secrets"]
    with pytest.raises(entry.EntryError, match="HTTP 404: no such Secret"):
        entry.read_secret("nope", url, sa)

    ran: list[tuple[list[str], dict[str, str]]] = []
    slept: list[float] = []
    env = {"SPECLOAD_SECRET": "specload-secrets", "SPECLOAD_HOLD_S": "30", "PATH": "/bin"}
    code = entry.main(
        ["--master", "--host", "http://h:8000", "--workers", "2"],
        env,
        run=lambda cmd, e: ran.append((cmd, e)) or 3,
        sleep=slept.append,
        secret=lambda name: entry.read_secret(name, url, sa),
    )
    assert code == 3 and slept == [30.0]  # the sweep's exit code, after the hold
    ((cmd, child_env),) = ran
    assert cmd[0] == "sweep" and child_env["SPECLOAD_MASTER_TOKEN"] == "t" * 32 and "OTHER" not in child_env
    # a worker gets the token too, and no hold
    ran.clear()
    assert (
        entry.main(
            ["--worker", "--master-host", "specload-master", "--workers", "2"],
            env,
            run=lambda cmd, e: ran.append((cmd, e)) or 0,
            sleep=slept.append,
            secret=lambda name: entry.read_secret(name, url, sa),
        )
        == 0
    )
    assert ran[0][1]["SPECLOAD_MASTER_TOKEN"] == "t" * 32 and slept == [30.0]


# ---------------------------------------------------------------- the guide and the image


def test_the_guide_shows_the_manifest_as_it_is() -> None:
    text = (OPERATOR / "locusttest.yaml").read_text()
    blocks = code_blocks(GUIDE.read_text(), "yaml")
    assert any(yaml.safe_load(b) == yaml.safe_load(text) for b in blocks), (
        "docs/deploy.md's LocustTest differs"
    )


def test_the_operator_image_is_specloads_with_the_entry() -> None:
    lines = [x for x in (OPERATOR / "Containerfile").read_text().splitlines() if x and not x.startswith("#")]
    assert any(x.startswith("FROM ") for x in lines)
    assert (
        "COPY docs/deploy/locust-operator/operator-entry.py /usr/local/bin/specload-operator-entry" in lines
    )
    assert 'ENTRYPOINT ["python3", "/usr/local/bin/specload-operator-entry"]' in lines
    assert "USER 10001:10001" in lines and K8S.is_dir()
