"""The deployment docs stay honest: docs/deploy.md, docs/deploy/Containerfile, docs/deploy/kubernetes/.

Every ``specload`` command line in them (manifest args, the image's CMD, the guide's code blocks,
``docker run IMAGE ...`` included) must parse with specload's own argument parsers, with full flag
names. The manifests must agree with each other: the worker's ``--master-port``, the Service port
and the master's ``--master-bind-port``; the master's ``--workers`` and the worker replicas; the
NetworkPolicy's pods; the Secret reference for the key in every container that runs specload;
non-root everywhere. No network, no container runtime, no cluster: a second or so.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml  # the dev extra (pyproject.toml)

from specload.cli import build_parser, settings
from specload.client.http import check_host
from specload.core.resources import builtin_scenario
from specload.workload.config import load_scenario

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


REPO = Path(__file__).resolve().parent.parent
GUIDE = REPO / "docs" / "deploy.md"
DEPLOY = REPO / "docs" / "deploy"
CONTAINERFILE = DEPLOY / "Containerfile"
K8S = DEPLOY / "kubernetes"

KEY_ENV = "SPECLOAD_API_KEY"
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.I)
# The image, wherever it is pushed: [registry[:port]/][path/]specload:TAG
IMAGE = re.compile(r"^(?:[\w.-]+(?::\d+)?/)*specload:[\w.-]+$")


# ------------------------------------------------------------------------------------------ parsing


def _strict(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """No abbreviated flags: the docs spell every flag in full (``--work`` would parse as ``--workers``)."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _strict(sub)
    return parser


def _parser_for(argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser specload's main() would hand these arguments to (sim, report and compare own theirs)."""
    if argv and argv[0] == "report":
        from specload.present.report import _parser

        return _parser(), argv[1:]
    if argv and argv[0] == "compare":
        from specload.present.compare import _parser

        return _parser(), argv[1:]
    if argv and argv[0] == "sim":
        from specload.sim.cli import build_parser as sim_parser

        return sim_parser(), argv[1:]
    return build_parser(), argv


def parse(argv: list[str], where: str) -> argparse.Namespace | None:
    """The parsed command line, None for ``--help``; AssertionError naming it when specload refuses it."""
    parser, rest = _parser_for(argv)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = _strict(parser).parse_args(rest)
    except SystemExit as e:
        if e.code == 0:  # --help
            return None
        raise AssertionError(
            f"{where}: `specload {shlex.join(argv)}` does not parse: {err.getvalue().strip()}"
        ) from None
    # Stray words would land in the Locust pass-through list: only after `--` do they belong there.
    if getattr(args, "locust_args", None) and "--" not in argv:
        raise AssertionError(f"{where}: `specload {shlex.join(argv)}`: unexpected words {args.locust_args}")
    if getattr(args, "command", None) in ("sweep", "ui"):
        _check_sweep(args, argv, where)
    return args


def _check_sweep(args: argparse.Namespace, argv: list[str], where: str) -> None:
    """What `specload sweep` checks before any load, short of files on the target machine."""
    s = settings(args)
    try:
        check_host(s.host)
        if s.scenario_file and builtin_scenario(s.scenario_file) is None:
            s = replace(s, scenario_file=None)  # a file where it runs (the ConfigMap's is checked below)
        s.scenario()
    except Exception as e:
        raise AssertionError(f"{where}: `specload {shlex.join(argv)}`: {e}") from None
    assert not (s.processes is not None and s.workers is not None), f"{where}: --processes with --workers"


def test_the_strict_parser_refuses_what_specload_refuses() -> None:
    """The checker itself: an invented flag, an abbreviation and a stray word all fail."""
    assert parse(["worker", "--master-host", "m", "--master-port", "5557"], "ok").master_port == 5557
    for bad in (
        ["worker", "--master", "m"],  # Locust's flag, not specload's
        ["sweep", "--host", "http://s:1", "--work", "2"],  # an abbreviation
        ["sweep", "--host", "http://s:1", "--workers", "2", "--expect-workers", "2"],
        ["worker", "--master-host", "m", "5557"],  # a stray word
        ["sweep", "--host", "http://s:1", "--levels", "1,0"],  # a value the field refuses
    ):
        with pytest.raises(AssertionError):
            parse(bad, "self-test")


# ------------------------------------------------------------------------------- shell in the guide

SEPARATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "(", ")"}
WRAPPERS = {"sudo", "exec", "nohup", "env", "time", "command"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def code_blocks(markdown: str, lang: str | None = None) -> list[str]:
    """Fenced code blocks, indented ones (in list items) included, dedented; only those marked
    ``lang`` when given (the README's output blocks are not commands)."""
    blocks, current, indent, keep = [], None, 0, True
    for line in markdown.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("```"):
            if current is None:
                current, indent = [], len(line) - len(stripped)
                keep = lang is None or stripped[3:].strip() == lang
            else:
                if keep:
                    blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line[indent:] if line[:indent].strip() == "" else line)
    assert current is None, "an unclosed code block"
    return blocks


def logical_lines(block: str) -> list[str]:
    """Lines with their backslash continuations joined."""
    out, buf = [], ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
        else:
            out.append(buf + line)
            buf = ""
    if buf:
        out.append(buf)
    return out


def shell_words(line: str) -> list[str]:
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    return list(lex)


def specload_invocations(line: str) -> list[list[str]]:
    """The argument lists of every ``specload`` run on this line: ``specload ...``, ``/path/specload ...``,
    ``ExecStart=/path/specload ...`` and ``docker|podman run [options] IMAGE ...`` (the image's
    ENTRYPOINT is specload), each one at a command's position."""
    try:
        words = shell_words(line)
    except ValueError:
        assert "specload" not in line, f"cannot split the shell line {line!r}"
        return []
    found: list[list[str]] = []
    at_command, i = True, 0
    while i < len(words):
        w = words[i]
        if w in SEPARATORS:
            at_command, i = True, i + 1
            continue
        if not at_command:
            i += 1
            continue
        if w.startswith("ExecStart="):
            w = w.split("=", 1)[1]
        elif w in WRAPPERS or ASSIGNMENT.match(w):
            i += 1
            continue
        at_command = False
        start = None
        if Path(w).name == "specload":
            start = i + 1
        elif w in ("docker", "podman") and words[i + 1 : i + 2] == ["run"]:
            j = i + 2
            while j < len(words) and words[j] not in SEPARATORS and not IMAGE.match(words[j]):
                j += 1
            own_entrypoint = any(x.startswith("--entrypoint") for x in words[i + 2 : j])
            if j < len(words) and IMAGE.match(words[j]) and not own_entrypoint:
                start = j + 1
        if start is not None:
            end = start
            while end < len(words) and words[end] not in SEPARATORS:
                end += 1
            found.append(words[start:end])
            i = end
        else:
            i += 1
    return found


def test_the_extractor_finds_every_form() -> None:
    assert specload_invocations("sudo A=1 specload worker --master-host m && echo specload x") == [
        ["worker", "--master-host", "m"]
    ]
    assert specload_invocations(
        'docker run --rm -e K -v "$PWD/r:/results" reg.io:5000/x/specload:1.0 sweep --host h'
    ) == [["sweep", "--host", "h"]]
    assert specload_invocations("ExecStart=/opt/specload/bin/specload worker --master-host m") == [
        ["worker", "--master-host", "m"]
    ]
    assert specload_invocations("docker run --entrypoint cp specload:1 -r /a /b") == []
    assert specload_invocations("pip install ./specload-checkout  # specload sweep") == []


def guide_invocations() -> list[list[str]]:
    return [
        inv
        for block in code_blocks(GUIDE.read_text())
        for line in logical_lines(block)
        for inv in specload_invocations(line)
    ]


def test_every_specload_command_in_the_guide_parses() -> None:
    invocations = guide_invocations()
    for argv in invocations:
        parse(argv, "docs/deploy.md")
    commands = {argv[0] for argv in invocations if argv}
    assert {"sweep", "worker", "report", "compare"} <= commands, commands  # the extractor found them


def test_every_specload_command_in_the_readme_parses() -> None:
    readme = REPO / "README.md"
    invocations = [
        inv
        for block in code_blocks(readme.read_text(), "sh")
        for line in logical_lines(block)
        for inv in specload_invocations(line)
    ]
    for argv in invocations:
        parse(argv, "README.md")
    assert {"sweep", "worker"} <= {argv[0] for argv in invocations if argv}


def test_the_guides_workers_reach_its_masters() -> None:
    """A worker's --master-host/--master-port is an address some master in the guide binds (or the
    loopback end of an SSH tunnel)."""
    sweeps = [parse(a, "docs/deploy.md") for a in guide_invocations() if a[:1] == ["sweep"]]
    workers = [parse(a, "docs/deploy.md") for a in guide_invocations() if a[:1] == ["worker"]]
    assert sweeps and workers
    hosts = {s.master_bind_host for s in sweeps if s.workers} - {"0.0.0.0"}
    ports = {s.master_bind_port for s in sweeps if s.workers}
    for w in workers:
        assert w.master_host in hosts, (w.master_host, hosts)
        assert w.master_port in ports, (w.master_port, ports)


# ------------------------------------------------------------------------------------- Containerfile


def containerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) pairs, continuations joined, comments dropped."""
    out = []
    for line in logical_lines(
        "\n".join(x for x in CONTAINERFILE.read_text().splitlines() if not x.lstrip().startswith("#"))
    ):
        if line.strip():
            op, _, rest = line.strip().partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def _instruction(op: str) -> list[str]:
    return [rest for o, rest in containerfile() if o == op]


def image_uid() -> int:
    (user,) = _instruction("USER")
    uid = user.split(":")[0]
    assert uid.isdigit(), f"USER {user}: a numeric UID, so that Kubernetes' runAsNonRoot can check it"
    assert int(uid) != 0
    return int(uid)


def test_containerfile_base_entrypoint_user_volume() -> None:
    import json

    args = dict(a.split("=", 1) for a in _instruction("ARG") if "=" in a)
    (base,) = _instruction("FROM")
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)].strip('"'), base)
    m = re.fullmatch(r"python:3\.(\d+)-slim(?:-\w+)?", base)
    assert m and int(m.group(1)) >= 11, base
    assert [json.loads(x) for x in _instruction("ENTRYPOINT")] == [["specload"]]
    for cmd in _instruction("CMD"):
        parse(json.loads(cmd), "Containerfile CMD")
    image_uid()
    assert any("/results" in json.loads(v) for v in _instruction("VOLUME"))
    run = " ".join(_instruction("RUN"))
    assert re.search(r"pip install \.(?=[\s;]|$)", run) and 'pip install ".[$EXTRAS]"' in run, run


def test_containerfile_copies_everything_the_package_is_built_from() -> None:
    """A new top-level folder in the package (pyproject's package-dir) must be copied into the image too."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    package_dir = project["tool"]["setuptools"].get("package-dir", {})
    needed = {"pyproject.toml", project["project"]["readme"]}
    for pkg in project["tool"]["setuptools"]["packages"]:
        needed.add(package_dir.get(pkg, pkg.split(".")[0]).split("/")[0])
    copied = set()
    for rest in _instruction("COPY"):
        copied.update(rest.split()[:-1])
    assert needed <= copied, f"not copied: {needed - copied}"
    for path in copied:
        assert (REPO / path).exists(), path


def test_containerfile_bakes_no_secret() -> None:
    for op in ("ENV", "ARG"):
        for rest in _instruction(op):
            for name in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", rest) or rest.split()[:1]:
                assert not SECRET_NAME.search(name), f"{op} {rest}: no secret in the image"


# --------------------------------------------------------------------------------------- Kubernetes


def manifests() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.rglob("*.y*ml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                assert {"apiVersion", "kind", "metadata"} <= set(doc), path
                doc["_file"] = str(path.relative_to(REPO))
                docs.append(doc)
    return docs


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in manifests() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_template(doc: dict[str, Any]) -> dict[str, Any] | None:
    if doc["kind"] == "Pod":
        return {"metadata": doc["metadata"], "spec": doc["spec"]}
    if doc["kind"] in ("Job", "Deployment", "StatefulSet", "DaemonSet"):
        return doc["spec"]["template"]
    return None


def pods() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(d, t) for d in manifests() if (t := pod_template(d)) is not None]


def specload_argv(container: dict[str, Any]) -> list[str] | None:
    """The specload command line a container runs (the image's ENTRYPOINT is specload), else None."""
    command, args = container.get("command"), container.get("args", [])
    if command is None:
        return list(args)
    if Path(command[0]).name == "specload":
        return [*command[1:], *args]
    return None


def specload_containers() -> list[tuple[dict[str, Any], dict[str, Any], argparse.Namespace]]:
    out = []
    for doc, tpl in pods():
        for c in tpl["spec"]["containers"]:
            argv = specload_argv(c)
            if argv is not None:
                out.append((doc, c, parse(argv, f"{doc['_file']} container {c['name']}")))
    return out


def role(command: str) -> tuple[dict[str, Any], dict[str, Any], argparse.Namespace]:
    (found,) = [x for x in specload_containers() if x[2].command == command]
    return found


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_manifests_parse_and_every_command_is_specloads() -> None:
    docs = manifests()
    kinds = {d["kind"] for d in docs}
    assert {"Job", "Deployment", "Service", "NetworkPolicy", "ConfigMap", "PersistentVolumeClaim"} <= kinds, (
        kinds
    )
    assert "Secret" not in kinds, (
        "the key's Secret is made with kubectl from a file, never shipped with a value"
    )
    for doc, tpl in pods():
        for c in tpl["spec"]["containers"]:
            assert IMAGE.match(c["image"]), f"{doc['_file']}: image {c['image']}"
            for word in [*c.get("command", []), *c.get("args", [])]:
                assert isinstance(word, str), f"{doc['_file']}: {word!r} must be a string (quote numbers)"
    assert {x[2].command for x in specload_containers()} == {"sweep", "worker"}


def test_master_job_runs_once_and_waits_for_every_worker_process() -> None:
    job, master_c, master = role("sweep")
    dep, _worker_c, worker = role("worker")
    assert job["kind"] == "Job" and dep["kind"] == "Deployment"
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert job["spec"].get("backoffLimit") == 0, "a retry would be a second run"
    processes = worker.processes if worker.processes is not None else 1
    assert processes >= 1, "--processes -1 depends on the node: give a count"
    assert master.workers == dep["spec"]["replicas"] * processes, "--workers = replicas x processes per pod"
    ports = {p["containerPort"]: p.get("name") for p in master_c.get("ports", [])}
    assert master.master_bind_port in ports


def test_the_master_port_is_one_port_everywhere() -> None:
    job, master_c, master = role("sweep")
    dep, _c, worker = role("worker")
    svc = one("Service")
    assert svc["spec"].get("type", "ClusterIP") == "ClusterIP"
    (port,) = svc["spec"]["ports"]
    target = port.get("targetPort", port["port"])
    if isinstance(target, str):
        (target,) = [p["containerPort"] for p in master_c["ports"] if p.get("name") == target]
    assert worker.master_port == port["port"] == master.master_bind_port == target
    assert worker.master_host.split(".")[0] == svc["metadata"]["name"]
    master_labels = job["spec"]["template"]["metadata"]["labels"]
    worker_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels_match(svc["spec"]["selector"], master_labels)
    assert not labels_match(svc["spec"]["selector"], worker_labels)


def test_network_policy_admits_only_workers_to_the_master_port() -> None:
    job, _c, master = role("sweep")
    dep, _c, _worker = role("worker")
    np = one("NetworkPolicy")["spec"]
    master_labels = job["spec"]["template"]["metadata"]["labels"]
    worker_labels = dep["spec"]["template"]["metadata"]["labels"]
    selector = np["podSelector"]["matchLabels"]
    assert labels_match(selector, master_labels) and not labels_match(selector, worker_labels)
    assert "Ingress" in np["policyTypes"]
    (rule,) = np["ingress"]
    assert rule["from"], "an empty `from` admits everyone"
    for peer in rule["from"]:
        assert set(peer) == {"podSelector"}, f"only pods of this namespace, by label: {peer}"
        sel = peer["podSelector"]["matchLabels"]
        assert sel and labels_match(sel, worker_labels), sel
        for doc, tpl in pods():  # no other pod of these manifests (the master, the reader) matches
            if (doc["kind"], doc["metadata"]["name"]) != (dep["kind"], dep["metadata"]["name"]):
                assert not labels_match(sel, tpl["metadata"].get("labels", {})), doc["_file"]
    assert rule["ports"] == [{"protocol": "TCP", "port": master.master_bind_port}]


def test_the_key_comes_from_a_secret_in_every_specload_container() -> None:
    refs = set()
    for doc, c, _args in specload_containers():
        env = {e["name"]: e for e in c.get("env", [])}
        assert KEY_ENV in env, f"{doc['_file']}: {c['name']} talks to the server and needs {KEY_ENV}"
        ref = env[KEY_ENV].get("valueFrom", {}).get("secretKeyRef")
        assert ref and "value" not in env[KEY_ENV], f"{doc['_file']}: {KEY_ENV} from a secretKeyRef only"
        refs.add((ref["name"], ref["key"]))
    for doc, tpl in pods():
        for c in tpl["spec"]["containers"]:
            for e in c.get("env", []):
                assert not (SECRET_NAME.search(e["name"]) and "value" in e), (
                    f"{doc['_file']}: literal {e['name']}"
                )
    (ref,) = refs
    # The guide's `kubectl create secret generic NAME --from-file=KEY=...` makes exactly that Secret.
    made = set()
    for block in code_blocks(GUIDE.read_text()):
        for line in logical_lines(block):
            words = shell_words(line) if "create secret generic" in line else []
            if words:
                name = words[words.index("generic") + 1]
                for w in words:
                    if w.startswith(("--from-file=", "--from-literal=")):
                        made.add((name, w.split("=", 2)[1]))
    assert ref in made and (ref[0], "SPECLOAD_MASTER_TOKEN") in made, (
        made,
        ref,
    )  # the key and the master token


def test_every_pod_runs_as_the_images_non_root_user() -> None:
    uid = image_uid()
    for doc, tpl in pods():
        pod_sc = tpl["spec"].get("securityContext", {})
        for c in tpl["spec"]["containers"]:
            sc = {**pod_sc, **c.get("securityContext", {})}
            where = f"{doc['_file']} container {c['name']}"
            assert sc.get("runAsNonRoot") is True, where
            assert sc.get("runAsUser") == uid, (
                f"{where}: runAsUser {sc.get('runAsUser')} vs the image's {uid}"
            )
            assert sc.get("allowPrivilegeEscalation") is False and not sc.get("privileged"), where


def test_scenario_and_results_volumes_are_wired(tmp_path: Path) -> None:
    job, master_c, master = role("sweep")
    spec = job["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in master_c["volumeMounts"]}
    # --scenario is a key of the mounted ConfigMap, and that TOML is a valid scenario.
    scenario = Path(master.scenario)
    cm_volume = mounts[str(scenario.parent)]["configMap"]
    cm = one("ConfigMap", cm_volume["name"])
    copy = tmp_path / scenario.name
    copy.write_text(cm["data"][scenario.name])
    sc = load_scenario(str(copy))
    assert sc.levels, sc
    # --out is a mounted claim that exists, and the reader pod mounts the same claim.
    claim = mounts[master.out]["persistentVolumeClaim"]["claimName"]
    one("PersistentVolumeClaim", claim)
    reader = one("Pod")
    assert {v.get("persistentVolumeClaim", {}).get("claimName") for v in reader["spec"]["volumes"]} == {claim}


def test_worker_sizing_and_no_cpu_limit() -> None:
    """One core requested per worker process, and no CPU limit (throttling would show up as server latency)."""
    for doc, c, args in specload_containers():
        resources = c.get("resources", {})
        assert "cpu" not in resources.get("limits", {}), f"{doc['_file']}: no CPU limit on a load generator"
        if args.command == "worker":
            processes = args.processes if args.processes is not None else 1
            assert float(resources["requests"]["cpu"]) >= processes, doc["_file"]


def test_the_guide_names_every_manifest_and_only_existing_ones() -> None:
    text = GUIDE.read_text()
    files = {str(p.relative_to(K8S)) for p in K8S.rglob("*.y*ml")}
    for f in files:
        assert f in text, f"docs/deploy.md does not mention {f}"
    for path in re.findall(r"docs/deploy/[\w./-]+", text):
        assert (REPO / path.rstrip(".")).exists(), path
