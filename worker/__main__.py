"""``llmserve-worker`` (``python -m worker``): start one vLLM engine from WORKER_* settings (or
print its command).

Modes:
  run   (default) wait for the model, check the layout, run vLLM until SIGTERM, stop its group.
  argv  check the settings against the model at WORKER_MODEL_PATH as `run` does, then print the
        vLLM command `run` would start (argv + added env) as JSON and exit; starts nothing.
  plan  which TP/PP/DP layouts fit a model on a cluster (`llmserve-worker plan --help`).

Every setting is a flag (``--tensor-parallel-size 2``) and an env var
(``WORKER_TENSOR_PARALLEL_SIZE=2``); flags win. Arguments after ``--`` are appended to vLLM's
command line verbatim (after WORKER_EXTRA_ARGS).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from pydantic_settings import CliSettingsSource

from model_store import cli_error
from model_store.cli_error import EXIT_FAILED
from worker.argv import build_command
from worker.launcher import EngineStartError, Launcher, MarkerTimeout
from worker.preflight import preflight
from worker.settings import LWS_ENV, SettingsError, WorkerSettings, load_settings

PROG = "llmserve-worker"
EXIT_BAD_SETTINGS = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, no usage dump: the pod log should say exactly what is wrong.
        _fail(EXIT_BAD_SETTINGS, f"{message} (see {self.prog} --help)")


def build_parser() -> tuple[argparse.ArgumentParser, CliSettingsSource[WorkerSettings]]:
    lws = ", ".join(f"--{f.replace('_', '-')} from {var}" for f, var in LWS_ENV.items())
    parser = _Parser(
        prog=PROG,
        description=__doc__,
        epilog=f"In a LeaderWorkerSet pod, unset settings fall back to its environment: {lws}.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "mode",
        nargs="?",
        # `plan` has a parser of its own (main() hands it over before this one parses); listed
        # here so that a mistyped mode names every mode there is.
        choices=("run", "argv", "plan"),
        default="run",
        help="run (default): start and supervise vLLM; argv: print its command as JSON; plan: "
             "which layouts fit a model (`plan --help`)",
    )
    # Every WorkerSettings field as a flag, added by pydantic-settings' own CLI source; a flag not
    # given leaves the env var / LWS value / default in charge.
    source: CliSettingsSource[WorkerSettings] = CliSettingsSource(
        WorkerSettings, root_parser=parser, cli_kebab_case=True, cli_implicit_flags=True,
    )
    return parser, source


def _split_passthrough(args: Sequence[str]) -> tuple[list[str], list[str]]:
    args = list(args)
    if "--" in args:
        cut = args.index("--")
        return args[:cut], args[cut + 1 :]
    return args, []


def _fail(code: int, message: str) -> NoReturn:
    cli_error.fail(PROG, message, code)


def main(args: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if args is None else args)
    if argv[:1] == ["plan"]:
        # The planner takes a model and a cluster, not worker settings: its own parser.
        from worker.plan import main as plan_main

        return plan_main(argv[1:])
    own, passthrough = _split_passthrough(argv)
    parser, source = build_parser()
    parsed = parser.parse_args(own)
    mode = parsed.mode
    overrides: dict[str, Any] = source(parsed_args=parsed)()
    try:
        settings = load_settings(**overrides)
    except SettingsError as exc:
        _fail(EXIT_BAD_SETTINGS, str(exc))
    if passthrough:
        settings = settings.model_copy(update={"extra_args": [*settings.extra_args, *passthrough]})

    if mode == "argv":
        # The checks `run` applies before it starts vLLM, so this prints the command `run` would
        # start, or refuses what `run` would refuse (the model must be at WORKER_MODEL_PATH).
        try:
            settings = preflight(settings, os.environ)
        except SettingsError as exc:
            _fail(EXIT_BAD_SETTINGS, str(exc))
        print(json.dumps(build_command(settings).to_json_dict(), indent=2))
        return 0
    command = build_command(settings)

    logging.basicConfig(level=logging.INFO, format="worker: %(levelname)s %(message)s")
    try:
        return Launcher(settings, command).run()
    except SettingsError as exc:
        _fail(EXIT_BAD_SETTINGS, str(exc))
    except (MarkerTimeout, EngineStartError) as exc:
        _fail(EXIT_FAILED, str(exc))


if __name__ == "__main__":
    sys.exit(main())
