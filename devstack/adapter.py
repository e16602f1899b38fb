"""`llmserve-devstack demo-adapter`: a real LoRA adapter for the demo model, made with PEFT.

For the worked example in docs/lora.md, the LoRA tests on real engines and the residency
benchmark: a PEFT directory (adapter_config.json + adapter_model.safetensors) for the model at
--model-dir, on q_proj and v_proj, seeded. PEFT's non-default initialisation
(`init_lora_weights=False`) gives non-zero weights, yet too small to move a greedy answer: the
demo model still answered "The capital of France is Paris." through such an adapter. Its lora_B
matrices are scaled (`--scale`, 30 by default), which makes the adapter answer differently from
the base model at temperature 0, and each seed differently from the others. The directory gets
its completion marker last (base: the model directory's name), as `model_store pull` leaves one.

Needs `peft` (the dev extra) beside torch and transformers; runs on the CPU in seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

from devstack.cli import EXIT_FAILED, PROG, Parser, error_line
from model_store.adapter import AdapterInfo
from model_store.hashing import manifest_of
from model_store.marker import write_marker


class AdapterError(RuntimeError):
    """The adapter cannot be made here (no peft, no model); the message says what to do."""


def make_demo_adapter(model_dir: Path, dest: Path, *, seed: int = 0, scale: float = 30.0,
                      rank: int = 8) -> Path:
    """Write the adapter to `dest` (created); its config names `model_dir` as its base."""
    try:
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise AdapterError(f"{exc.name} is not installed: pip install peft (the dev extra)") \
            from None
    if not (model_dir / "config.json").is_file():
        raise AdapterError(f"{model_dir} has no config.json: not a model directory")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"],
                        init_lora_weights=False, task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(scale)
    dest.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(dest)
    # Complete as a pull leaves it (the marker last, with its base and rank), so a worker loads
    # it from here as it is; a push leaves the marker out.
    write_marker(dest, source=f"devstack demo-adapter --seed {seed} --scale {scale:g}",
                 files=manifest_of(dest), adapter=AdapterInfo(model_dir.name, rank))
    return dest


def main(argv: list[str]) -> int:
    prog = f"{PROG} demo-adapter"
    p = Parser(prog=prog, description=__doc__)
    p.add_argument("--model-dir", type=Path, required=True, help="the base model's directory")
    p.add_argument("--dest", type=Path, required=True, help="directory to write the adapter to")
    p.add_argument("--seed", type=int, default=0, help="torch seed: one adapter per seed")
    p.add_argument("--scale", type=float, default=30.0, help="factor on the lora_B matrices")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank r")
    args = p.parse_args(argv)
    if args.rank < 1:
        p.fail(f"--rank must be at least 1 (got {args.rank})")
    try:
        out = make_demo_adapter(args.model_dir, args.dest, seed=args.seed, scale=args.scale,
                                rank=args.rank)
    except (AdapterError, OSError) as exc:
        error_line(prog, str(exc))
        return EXIT_FAILED
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
