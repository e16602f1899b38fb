"""`make compare` (`llmserve-devstack compare`): a TP pool and a multi-node PP pool of the same
model behind one gateway, then `python -m loadtest compare` between them and an A/A run, all
written under run/compare/.

- Model: model_store/perfmodel.py's performance-only checkpoint (the demo tokenizer, a Llama shape
  with 8 heads and 2 KV heads, random weights), since the demo model allows only TP 1 or 3.
- TP pool: one worker, tensor parallel 2, ranks bound to cores 0 and 1.
- PP pool: two "nodes" as two worker processes on loopback, configured as the chart's
  LeaderWorkerSet configures its pods (WORKER_* settings; LWS_LEADER_ADDRESS, LWS_WORKER_INDEX,
  LWS_GROUP_SIZE for the group); the leader serves the API on core 0, the follower runs its
  pipeline stage headless on core 1 (the worker starts it through vLLM's real CLI).
- Both pools share the two cores. Before measuring, each pool's CPU use is sampled while it is
  idle and while the other pool serves a load, so the report says what an idle pool costs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from devstack.cli import EXIT_FAILED, PROG, Parser, error_line
from devstack.procs import Proc, free_port, tree_cpu_seconds
from devstack.stack import CPU_FLOW_ARGS, wait_http_ok
from loadtest.errors import UsageError
from loadtest.settings import parse_settings
from model_store.perfmodel import PerfModelError, ensure_perf_model

TP_NAME, PP_NAME = "perf-tp", "perf-pp"
# The A/A report beside this one (run/compare/a-a/), as a link relative to tp-vs-pp/report.md.
AA_LINK = str(Path("..", "a-a", "report.md"))


def _worker_env(model: Path, name: str, nice: int, **settings: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.update({"WORKER_MODEL_PATH": str(model), "WORKER_SERVED_MODEL_NAME": name,
                "WORKER_DEVICE": "cpu", "WORKER_HOST": "127.0.0.1",
                "WORKER_CPU_KVCACHE_SPACE_GIB": "1", "WORKER_DRAIN_TIMEOUT_S": "5",
                # The gateway and the load client share these cores (devstack.stack's reason).
                "WORKER_NICE": str(nice)})
    env.update({f"WORKER_{k.upper()}": v for k, v in settings.items()})
    return env


def start_pools(model: Path, logs: Path,
                nice: int = 10) -> tuple[dict[str, list[Proc]], dict[str, str]]:
    tp_port, pp_port, master_port = free_port(), free_port(), free_port()
    worker = [sys.executable, "-m", "worker"]
    tp = Proc("tp-pool", worker, _worker_env(
        model, TP_NAME, nice, tensor_parallel_size="2", port=str(tp_port), cpu_threads_bind="0|1"),
        logs / "tp-pool.log")
    lws = {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": "2"}
    pp_settings = {"pipeline_parallel_size": "2", "master_port": str(master_port),
                   "port": str(pp_port)}
    leader = Proc("pp-leader", worker, {**_worker_env(model, PP_NAME, nice, cpu_threads_bind="0",
                                                      **pp_settings),
                                        **lws, "LWS_WORKER_INDEX": "0"}, logs / "pp-leader.log")
    follower = Proc("pp-follower", worker, {**_worker_env(model, PP_NAME, nice, cpu_threads_bind="1",
                                                          **pp_settings),
                                            **lws, "LWS_WORKER_INDEX": "1"},
                    logs / "pp-follower.log")
    pools = {"tp": [tp], "pp": [leader, follower]}
    urls = {"tp": f"http://127.0.0.1:{tp_port}", "pp": f"http://127.0.0.1:{pp_port}"}
    return pools, urls


def _load(url: str, model: str, stop: threading.Event, streams: int) -> None:
    def loop() -> None:
        with httpx.Client(timeout=300) as client:
            while not stop.is_set():
                client.post(url + "/v1/chat/completions", json={
                    "model": model, "max_tokens": 64, "temperature": 0,
                    "messages": [{"role": "user", "content": "Explain pipeline parallelism."}]})
    threads = [threading.Thread(target=loop, daemon=True) for _ in range(streams)]
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(300)


def idle_cost(pools: dict[str, list[Proc]], gateway: str, window_s: float) -> dict[str, float]:
    """Cores used by each pool while idle, and while the other pool serves 4 streams."""
    out: dict[str, float] = {}
    t0 = time.monotonic()
    c0 = {k: tree_cpu_seconds(v) for k, v in pools.items()}
    time.sleep(window_s)
    dt = time.monotonic() - t0
    for k, v in pools.items():
        out[f"{k}_idle_cores"] = round((tree_cpu_seconds(v) - c0[k]) / dt, 3)
    for busy, idle, model in (("tp", "pp", TP_NAME), ("pp", "tp", PP_NAME)):
        stop = threading.Event()
        thread = threading.Thread(target=_load, args=(gateway, model, stop, 4), daemon=True)
        thread.start()
        time.sleep(3)  # the load is on
        t0 = time.monotonic()
        c_idle, c_busy = tree_cpu_seconds(pools[idle]), tree_cpu_seconds(pools[busy])
        time.sleep(window_s)
        dt = time.monotonic() - t0
        out[f"{idle}_idle_cores_while_{busy}_serves"] = round(
            (tree_cpu_seconds(pools[idle]) - c_idle) / dt, 3)
        out[f"{busy}_busy_cores"] = round((tree_cpu_seconds(pools[busy]) - c_busy) / dt, 3)
        stop.set()
        thread.join(300)
    return out


def compare_flags(gateway: str, out: Path, targets: list[str], users: str, duration: str,
                  rounds: int, max_tokens: int) -> list[str]:
    """`loadtest compare`'s flags for one comparison."""
    argv = ["--host", gateway]
    for t in targets:
        argv += ["--target", t]
    return argv + ["--users", users, "--duration", duration, "--rounds", str(rounds),
                   "--workload", "chat", "--max-tokens", str(max_tokens), "--out", str(out),
                   "--accelerator", "core"]


def _compare(flags: list[str]) -> int:
    argv = [sys.executable, "-m", "loadtest", "compare", *flags]
    print("+ " + " ".join(argv[1:]), flush=True)
    return subprocess.run(argv, check=False).returncode


def append_setup(out: Path, setup: dict[str, object]) -> None:
    """The machine's side of the story, appended to the TP-vs-PP report: how the pools shared
    the cores, what an idle pool cost meanwhile, and the A/A run's ratios."""
    cost = setup["cpu_cores"]
    assert isinstance(cost, dict)
    lines = ["", "## This machine: how the two pools shared it", "",
             ("Both pools ran at the same time on the same 2 cores (TP=2: ranks on cores 0 and 1; "
             "PP=2: leader on core 0, follower on core 1), and the load alternated between them. "
             "CPU used by each pool's processes (cores, from /proc), sampled for "
             "a few seconds each:"), "",
             "| state | TP pool | PP pool |", "|---|---:|---:|",
             f"| both idle | {cost['tp_idle_cores']} | {cost['pp_idle_cores']} |",
             (f"| TP pool serving 4 streams | {cost['tp_busy_cores']} | "
             f"{cost['pp_idle_cores_while_tp_serves']} |"),
             (f"| PP pool serving 4 streams | {cost['tp_idle_cores_while_pp_serves']} | "
             f"{cost['pp_busy_cores']} |"), ""]
    aa_path = out / "a-a" / "summary.json"
    if aa_path.exists():
        aa = json.loads(aa_path.read_text())
        runs = aa["runs"]
        a, b = runs[0], runs[1]
        ratio = b["output_tok_s"] / a["output_tok_s"] if a["output_tok_s"] else float("nan")
        lines += [(f"A/A run (the TP pool as both targets, users={a['users']:g}, "
                  f"{aa['rounds']} rounds each, [report]({AA_LINK})): output tok/s "
                  f"{a['output_tok_s']:.1f} and {b['output_tok_s']:.1f}, ratio {ratio:.3f}; "
                  f"TTFT p50 {a['ttft_ms']['p50']:.0f} and {b['ttft_ms']['p50']:.0f} ms."), ""]
    report = out / "tp-vs-pp" / "report.md"
    if report.exists():
        with open(report, "a") as fh:
            fh.write("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog=f"{PROG} compare", description=__doc__)
    p.add_argument("--demo-dir", type=Path, default=Path("models/SmolLM2-135M-Instruct"),
                   help="the demo model (its tokenizer is reused)")
    p.add_argument("--perf-dir", type=Path, default=Path("models/perf-llama-tp2"),
                   help="where the performance-only checkpoint is built")
    p.add_argument("--out", type=Path, default=Path("run/compare"), help="reports and logs")
    p.add_argument("--users", default="1,4,8", help="closed-loop levels")
    p.add_argument("--duration", default="20s", help="one run's length")
    p.add_argument("--rounds", type=int, default=2, help="A B runs per level")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per answer")
    p.add_argument("--engine-nice", type=int, default=10, metavar="0-19",
                   help="CPU nice of the engines' sessions (worker --nice): 10 lets the gateway and "
                        "the client answer first; on a machine shared with other work, 0, or the "
                        "engines get a tenth of a core each and start in tens of minutes")
    p.add_argument("--idle-window-s", type=float, default=10.0, help="CPU sampling window")
    args = p.parse_args(argv)
    if args.idle_window_s <= 0:
        p.fail(f"--idle-window-s must be above 0 (got {args.idle_window_s})")
    # The comparisons run once the pools are up, minutes from now: loadtest's own rules check
    # their flags first (the gateway's URL stands in for the one it will get).
    levels = args.users.split(",")

    def comparisons(gateway: str) -> list[list[str]]:
        """TP against PP at every level, then the A/A run at the middle one."""
        return [compare_flags(gateway, args.out / "tp-vs-pp", [f"tp={TP_NAME}", f"pp={PP_NAME}"],
                              args.users, args.duration, args.rounds, args.max_tokens),
                compare_flags(gateway, args.out / "a-a", [f"tp={TP_NAME}", f"tp-again={TP_NAME}"],
                              levels[len(levels) // 2], args.duration, args.rounds,
                              args.max_tokens)]

    for flags in comparisons("http://127.0.0.1:1"):
        try:
            parse_settings(flags)
        except UsageError as exc:
            p.fail(f"loadtest compare would refuse: {exc}")

    try:
        model = ensure_perf_model(args.demo_dir, args.perf_dir)
    except PerfModelError as exc:  # --demo-dir without the demo model, --perf-dir not ours
        p.fail(str(exc))
    except OSError as exc:
        error_line(f"{PROG} compare", f"cannot build the model at {args.perf_dir}: {exc}")
        return EXIT_FAILED
    logs = args.out / "logs"
    pools, urls = start_pools(model, logs, args.engine_nice)
    procs = [proc for group in pools.values() for proc in group]
    gateway: Proc | None = None
    t_start = time.monotonic()
    try:
        print("starting the TP pool (TP=2) and the PP pool (PP=2, leader + headless follower); "
              f"2-5 minutes on 2 cores; logs in {logs}/", flush=True)
        for url in urls.values():
            wait_http_ok(url + "/health", 900, procs)
        started_s = time.monotonic() - t_start
        gw_port = free_port()
        layouts = [{"name": "tp", "model": TP_NAME, "tp": 2, "pp": 1, "nodes": 1},
                   {"name": "pp", "model": PP_NAME, "tp": 1, "pp": 2, "nodes": 2}]
        gw_argv = [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(gw_port),
                   *CPU_FLOW_ARGS, "--pools", json.dumps(layouts),
                   "--backend", urls["tp"], "--backend", urls["pp"]]
        gateway = Proc("gateway", gw_argv, dict(os.environ), logs / "gateway.log")
        gw_url = f"http://127.0.0.1:{gw_port}"
        wait_http_ok(gw_url + "/ready", 60, [gateway])
        print(f"pools up after {started_s:.0f} s; measuring idle-pool CPU ...", flush=True)
        cost = idle_cost(pools, gw_url, args.idle_window_s)
        print(f"CPU (cores): {cost}", flush=True)
        rc, rc_aa = [_compare(flags) for flags in comparisons(gw_url)]
        setup = {"pools_started_s": round(started_s), "cpu_cores": cost,
                 "shared_cores": True, "total_s": round(time.monotonic() - t_start)}
        (args.out / "setup.json").write_text(json.dumps(setup, indent=1) + "\n")
        append_setup(args.out, setup)
        print(f"setup: {setup}\nreports: {args.out}/tp-vs-pp/report.md, "
              f"{args.out}/a-a/report.md", flush=True)
        return rc or rc_aa
    except (RuntimeError, TimeoutError) as exc:
        error_line(f"{PROG} compare", str(exc))
        return EXIT_FAILED
    finally:
        for proc in ([gateway] if gateway else []) + procs:
            proc.stop()


if __name__ == "__main__":
    sys.exit(main())
