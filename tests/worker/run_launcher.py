"""Run worker.launcher.Launcher around an arbitrary command, as its own process (tests only).

usage: run_launcher.py MODEL_DIR DRAIN_TIMEOUT_S -- ENGINE_ARGV...

ENGINE_BIND in the environment becomes the command's VLLM_CPU_OMP_THREADS_BIND, as worker.argv
would set it.
"""

from __future__ import annotations

import logging
import os
import sys

from worker.argv import Command
from worker.launcher import Launcher
from worker.settings import load_settings


def main() -> int:
    model_dir, drain, sep, *engine_argv = sys.argv[1:]
    assert sep == "--" and engine_argv, __doc__
    logging.basicConfig(level=logging.INFO, format="worker: %(levelname)s %(message)s")
    settings = load_settings(model_path=model_dir, device="cpu", drain_timeout_s=drain)
    bind = os.environ.get("ENGINE_BIND")
    env = {"VLLM_CPU_OMP_THREADS_BIND": bind} if bind else {}
    return Launcher(settings, Command(argv=tuple(engine_argv), env=env)).run()


if __name__ == "__main__":
    sys.exit(main())
