from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from model_store.marker import write_marker
from tests.ports import free_port
from worker.launcher import MarkerTimeout, exit_status, group_members, wait_for_marker

if TYPE_CHECKING:
    from tests.worker.conftest import Spawner

HERE = Path(__file__).resolve().parent
FAKE_ENGINE = HERE / "fake_engine.py"
RUN_LAUNCHER = HERE / "run_launcher.py"
ModelDirFactory = Callable[..., Path]


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def read_pids(pidfile: Path, proc: subprocess.Popen[str], timeout_s: float = 30) -> tuple[int, int]:
    deadline = time.monotonic() + timeout_s
    while not pidfile.exists():
        assert proc.poll() is None, f"launcher exited early with {proc.returncode}"
        assert time.monotonic() < deadline, "fake engine never wrote its pids"
        time.sleep(0.05)
    api, child = pidfile.read_text(encoding="utf-8").split()
    return int(api), int(child)


# --- marker wait --------------------------------------------------------------------------------


def test_marker_wait_times_out_with_a_clear_error(make_model_dir: ModelDirFactory) -> None:
    model = make_model_dir(complete=False)
    started = time.monotonic()
    with pytest.raises(MarkerTimeout) as caught:
        wait_for_marker(model, timeout_s=0.3, stop=threading.Event(), poll_s=0.05)
    assert 0.3 <= time.monotonic() - started < 3
    message = str(caught.value)
    assert str(model) in message and "WORKER_MARKER_TIMEOUT_S=0.3s" in message


def test_marker_wait_returns_when_the_marker_appears(make_model_dir: ModelDirFactory) -> None:
    model = make_model_dir(complete=False)
    timer = threading.Timer(0.3, write_marker, args=(model, "test", {}))
    timer.start()
    try:
        assert wait_for_marker(model, timeout_s=10, stop=threading.Event(), poll_s=0.05) is True
    finally:
        timer.cancel()


def test_marker_wait_gives_up_when_asked_to_stop(make_model_dir: ModelDirFactory) -> None:
    model = make_model_dir(complete=False)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    assert wait_for_marker(model, timeout_s=10, stop=stop, poll_s=0.05) is False


@pytest.mark.parametrize(
    ("returncode", "status"), [(0, 0), (3, 3), (-signal.SIGTERM, 143), (-9, 137)]
)
def test_exit_status_like_a_shell(returncode: int, status: int) -> None:
    assert exit_status(returncode) == status


# --- the process group --------------------------------------------------------------------------


def test_control_sigterm_to_the_server_alone_orphans_its_child(
    tmp_path: Path, spawner: Spawner
) -> None:
    """The problem the launcher solves: signalling only the API server leaves its child running."""
    pidfile = tmp_path / "pids"
    fake = spawner.start([sys.executable, str(FAKE_ENGINE), str(pidfile)])
    api, child = read_pids(pidfile, fake)
    os.kill(api, signal.SIGTERM)
    fake.wait(timeout=10)
    time.sleep(0.3)
    assert alive(child)
    assert group_members(api) == [child]


def launch(spawner: Spawner, model_dir: Path, pidfile: Path, *engine_args: str,
           drain: float = 5, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """The launcher (`drain` s to drain) around the fake engine, stderr captured."""
    return spawner.start(
        [sys.executable, str(RUN_LAUNCHER), str(model_dir), str(drain), "--",
         sys.executable, str(FAKE_ENGINE), str(pidfile), *engine_args],
        stderr=subprocess.PIPE, env=env or {},
    )


def test_sigterm_ends_the_whole_group_despite_a_child_ignoring_it(
    tmp_path: Path, spawner: Spawner, make_model_dir: ModelDirFactory
) -> None:
    pidfile = tmp_path / "pids"
    drain = 1.0
    launcher = launch(spawner, make_model_dir(), pidfile, drain=drain)
    api, child = read_pids(pidfile, launcher)
    spawner.track(api)
    assert os.getpgid(api) == api != os.getpgid(launcher.pid)  # vLLM got a group of its own
    assert sorted(group_members(api)) == sorted([api, child])

    started = time.monotonic()
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=drain + 15)
    elapsed = time.monotonic() - started

    assert group_members(api) == []
    assert not alive(api) and not alive(child)
    assert elapsed >= drain  # the child was given the drain time before SIGKILL
    assert "after WORKER_DRAIN_TIMEOUT_S=1s; SIGKILL" in stderr
    assert launcher.returncode == 0  # the API server's own status (it exited 0 on SIGTERM)


def test_a_polite_engine_stops_without_sigkill(
    tmp_path: Path, spawner: Spawner, make_model_dir: ModelDirFactory
) -> None:
    pidfile = tmp_path / "pids"
    drain = 20.0
    launcher = launch(spawner, make_model_dir(), pidfile, "--polite", drain=drain)
    api, child = read_pids(pidfile, launcher)
    spawner.track(api)
    started = time.monotonic()
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=drain + 15)
    assert time.monotonic() - started < drain / 2
    assert group_members(api) == [] and not alive(child)
    assert "SIGKILL" not in stderr
    assert launcher.returncode == 0


def test_an_engine_crash_is_reported_and_its_orphans_are_killed(
    tmp_path: Path, spawner: Spawner, make_model_dir: ModelDirFactory
) -> None:
    pidfile = tmp_path / "pids"
    launcher = launch(spawner, make_model_dir(), pidfile, "--exit-code", "3", drain=0.5)
    _, stderr = launcher.communicate(timeout=30)
    api, child = pidfile.read_text(encoding="utf-8").split()
    spawner.track(int(api))
    assert launcher.returncode == 3
    assert "vLLM exited by itself with status 3" in stderr
    assert group_members(int(api)) == [] and not alive(int(child))


def test_nice_lowers_the_engine_sessions_priority(
    tmp_path: Path, spawner: Spawner, make_model_dir: ModelDirFactory
) -> None:
    pidfile = tmp_path / "pids"
    launcher = launch(spawner, make_model_dir(), pidfile, "--polite", env={"WORKER_NICE": "7"})
    api, child = read_pids(pidfile, launcher)
    spawner.track(api)
    assert os.getpriority(os.PRIO_PROCESS, api) == 7
    assert os.getpriority(os.PRIO_PROCESS, launcher.pid) == os.getpriority(os.PRIO_PROCESS, 0)
    autogroup = Path(f"/proc/{api}/autogroup")
    if autogroup.exists():
        # The whole session shares one autogroup; its nice is what weighs against other sessions.
        assert autogroup.read_text().split()[-1] == "7"
        assert Path(f"/proc/{child}/autogroup").read_text() == autogroup.read_text()
        assert Path(f"/proc/{launcher.pid}/autogroup").read_text() != autogroup.read_text()
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=20)
    assert launcher.returncode == 0
    assert "nice 7" in stderr


def _allowed(pid: int) -> set[int]:
    return set(os.sched_getaffinity(pid))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to narrow to one")
@pytest.mark.slow  # the launcher looks once a second: 1.5 s of real time on purpose
def test_a_cpu_engine_starts_on_its_bind_and_gets_the_cpus_back_once_it_serves(
    tmp_path: Path, spawner: Spawner, make_model_dir: ModelDirFactory
) -> None:
    """worker.startup_cpus: torch's MKL probes every allowed CPU at import by moving onto it, and
    a move onto another engine's busy core hung for minutes here."""
    pidfile = tmp_path / "pids"
    mine = _allowed(0)
    bind = min(mine)
    port = free_port()
    launcher = launch(
        spawner, make_model_dir(), pidfile, "--polite", "--worker-title", "--serve-port", str(port),
        env={"ENGINE_BIND": str(bind), "WORKER_PORT": str(port), "WORKER_HOST": "127.0.0.1"})
    api, worker = read_pids(pidfile, launcher)
    spawner.track(api)
    core = int(pidfile.with_suffix(".core").read_text(encoding="utf-8"))
    # Until it serves, the whole tree is on the bind's CPU, children included.
    assert _allowed(api) == _allowed(worker) == _allowed(core) == {bind}
    time.sleep(1.5)  # the launcher looks every second: still not serving, still narrowed
    assert _allowed(api) == {bind}

    def widened(pid: int) -> bool:
        return all(_allowed(int(t)) == mine for t in os.listdir(f"/proc/{pid}/task"))

    pidfile.with_suffix(".serve").touch()
    deadline = time.monotonic() + 10
    while not (widened(api) and widened(core)):
        assert time.monotonic() < deadline, "the API server or engine core never got its CPUs"
        time.sleep(0.1)
    # Every thread of the API server and the engine core; not the model rank, whose binding is
    # vLLM's own.
    assert _allowed(worker) == {bind}
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=20)
    assert launcher.returncode == 0
    assert f"vLLM starts on CPUs {bind} (its bind) until it serves" in stderr
    assert "vLLM serves: its API server and engine core may use CPUs" in stderr


def test_an_engine_without_a_bind_starts_on_every_cpu(
    tmp_path: Path, spawner: Spawner, make_model_dir: ModelDirFactory
) -> None:
    pidfile = tmp_path / "pids"
    launcher = launch(spawner, make_model_dir(), pidfile, "--polite")
    api, _ = read_pids(pidfile, launcher)
    spawner.track(api)
    assert _allowed(api) == _allowed(0)
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=20)
    assert "until it serves" not in stderr
