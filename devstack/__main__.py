"""`llmserve-devstack` (`python -m devstack`): the README's `make up`. Ctrl-C stops everything, no
orphans left. `llmserve-devstack compare` is `make compare` (devstack/compare.py);
`llmserve-devstack demo-adapter` makes a LoRA adapter for the demo model (devstack/adapter.py)."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from devstack.cli import EXIT_FAILED, PROG, Parser, error_line
from devstack.stack import LocalStack

BANNER = """
llmserve is up: {n} vLLM-CPU workers behind the gateway at {url}

  curl {url}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "What is the capital of France?"}}], "temperature": 0}}'

  python - <<'PY'
  from openai import OpenAI
  client = OpenAI(base_url="{url}/v1", api_key="unused")
  r = client.chat.completions.create(model="{model}", temperature=0,
        messages=[{{"role": "user", "content": "What is the capital of France?"}}])
  print(r.choices[0].message.content)
  PY

Metrics: {url}/metrics   Logs: {logs}/   Stop: Ctrl-C
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["compare"]:
        from devstack.compare import main as compare

        return compare(argv[1:])
    if argv[:1] == ["demo-adapter"]:
        from devstack.adapter import main as demo_adapter

        return demo_adapter(argv[1:])
    p = Parser(prog=PROG, description=__doc__)
    p.add_argument("--model-dir", type=Path, required=True, help="bootstrapped model directory")
    p.add_argument("--workers", type=int, default=2, help="data-parallel vLLM-CPU replicas")
    p.add_argument("--port", type=int, default=8000, help="gateway port")
    p.add_argument("--worker-base-port", type=int, default=8101, help="first worker port")
    p.add_argument("--log-dir", type=Path, default=Path("run/logs"), help="process logs")
    # The range is checked once, by the worker's settings (WORKER_NICE), which fail at start-up.
    p.add_argument("--engine-nice", type=int, default=10, metavar="0-19",
                   help="CPU nice of the engines' sessions, so the gateway sharing these cores "
                        "answers first (worker --nice); 0 to treat them as equals")
    p.add_argument("--responses-store", action=argparse.BooleanOptionalAction, default=True,
                   help="keep Responses API answers in the engines' memory, for "
                        "previous_response_id, GET and cancel by id (never evicted: vLLM's "
                        "VLLM_ENABLE_RESPONSES_API_STORE, docs/responses.md; default on)")
    p.add_argument("--pooling-workers", type=int, default=0,
                   help="also serve the model as an embedding model (embeddings, score, rerank) "
                        "in a pool of its own, as MODEL-embed, on this many more workers "
                        "(default 0)")
    args = p.parse_args(argv)
    if args.workers < 1:
        p.fail(f"--workers must be at least 1 (got {args.workers})")
    if args.pooling_workers < 0:
        p.fail(f"--pooling-workers must be at least 0 (got {args.pooling_workers})")
    if not args.model_dir.is_dir():
        p.fail(f"--model-dir {args.model_dir} is not a directory; build the demo model with "
               f"`python -m model_store bootstrap-demo --dest {args.model_dir}` (make up does)")

    stack = LocalStack(args.model_dir, workers=args.workers, gateway_port=args.port,
                       worker_base_port=args.worker_base_port, log_dir=args.log_dir,
                       engine_nice=args.engine_nice, responses_store=args.responses_store,
                       pooling_workers=args.pooling_workers)
    # The gateway starts once the engines are up, minutes from now: its settings (the flags
    # above, GATEWAY_* env) are checked by its own rules first.
    from gateway.cli import UsageError, parse_settings

    try:
        parse_settings(stack.gateway_flags())
    except UsageError as exc:
        p.fail(f"the gateway would refuse its settings: {exc}")
    stopping = False

    def on_signal(sig: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        raise KeyboardInterrupt

    # Explicit for SIGINT too: a shell that starts us in the background leaves SIGINT ignored.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        print(f"starting {args.workers} vLLM-CPU workers (2-3 minutes on 2 cores; "
              f"logs in {args.log_dir}/) ...", flush=True)
        stack.start_workers()
        stack.wait_workers()
        stack.start_gateway()
        stack.wait_gateway()
        print(BANNER.format(n=args.workers, url=stack.gateway_url, model=args.model_dir.name,
                            logs=args.log_dir), flush=True)
        while True:
            for proc in stack.all_procs():
                if not proc.alive():
                    print(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}",
                          file=sys.stderr)
                    return 1
            time.sleep(1)
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
        return 0
    except (RuntimeError, TimeoutError) as exc:
        error_line(PROG, str(exc))
        return EXIT_FAILED
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
