"""The RL page in a real headless Chromium (Debian's, installed by this module) during a real run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from dagrl.dashboard import ACTORS, METRICS
from tests.debian import CHROMIUM, HEADLESS_CHROMIUM_FLAGS, ensure
from tests.helpers import wait_for

ARTIFACTS = Path(os.environ.get("DAGRL_TEST_ARTIFACTS", Path(__file__).resolve().parent.parent / "test-artifacts"))


@pytest.fixture(scope="module")
def browser():
    ensure(*CHROMIUM)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for flag in (*HEADLESS_CHROMIUM_FLAGS, "--disable-dev-shm-usage", "--window-size=1400,1100"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    yield driver
    driver.quit()


@pytest.fixture
def running(tmp_path):
    """``dagrl run`` of Ape-X DQN (samplers, replay, learner) in a subprocess; yields its dashboard link."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dagrl",
            "run",
            "graphs/dqn-cartpole-apex.yaml",
            "--set",
            f"runs_dir={tmp_path}",
            "--set",
            "stop.mean_return=null",
            "--set",
            "stop.wall_time_s=240",
            "--set",
            "roles.replay.memory=1MiB",  # small, so the replay plot shows rows on disk too
        ],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    link = None
    for line in proc.stderr:
        match = re.search(r"RL page: (http://\S+?)\)", line)
        if match:
            link = match.group(1)
            break
    assert link, "dagrl run printed no dashboard link"
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
    yield link
    os.killpg(proc.pid, signal.SIGINT)  # first Ctrl-C: finish the iteration, checkpoint, stop
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def points(driver, name: str) -> int:
    return driver.execute_script(
        "const m = Bokeh.documents.length && Bokeh.documents[0].get_model_by_name(arguments[0]);"
        "if (!m) return -1; const d = m.data; const k = Object.keys(d)[0]; return k ? d[k].length : 0;",
        name,
    )


def column(driver, source: str, field: str) -> list:
    return driver.execute_script(
        "const m = Bokeh.documents[0].get_model_by_name(arguments[0]); return Array.from(m.data[arguments[1]]);",
        source,
        field,
    )


def test_rl_page_shows_live_training_and_every_role(browser, running):
    base = running.rsplit("/", 1)[0]
    plots = json.loads(urllib.request.urlopen(f"{base}/individual-plots.json", timeout=10).read())
    assert "/individual-dagrl" in plots.values(), plots

    browser.get(running)
    wait_for(lambda: points(browser, "dagrl-episodes") > 20, 120, "episode returns on the page")
    wait_for(lambda: set(column(browser, "dagrl-episodes", "sampler")) == {0, 1}, 60, "episodes of both samplers")
    wait_for(lambda: points(browser, "dagrl-rates") > 3, 60, "throughput points")
    wait_for(lambda: points(browser, "dagrl-replay") > 1, 60, "replay fill points")
    wait_for(lambda: points(browser, "dagrl-staleness") > 1, 60, "staleness points")
    wait_for(lambda: points(browser, "dagrl-runs") == 1, 60, "the run in the plot of every run's mean return")
    roles = wait_for(lambda: set(column(browser, "dagrl-actors", "role")), 60, "the actor table")
    assert roles == {"sampler", "replay", "learner"}
    states = column(browser, "dagrl-actors", "state")
    assert all(s == "idle" or s.startswith("running") for s in states), states
    assert len(column(browser, "dagrl-actors", "worker")) == 4  # 2 samplers, replay, learner

    def in_env() -> dict[str, list[str]]:  # role -> its rows' share of fragment time inside env.step
        out: dict[str, list[str]] = {}
        roles, shares = column(browser, "dagrl-actors", "role"), column(browser, "dagrl-actors", "in_env")
        for role, share in zip(roles, shares, strict=True):
            out.setdefault(role, []).append(share)
        return out

    shares = wait_for(
        lambda: all(s.endswith(" %") for s in in_env()["sampler"]) and in_env(), 60, "samplers' env share"
    )
    assert shares["learner"] == ["-"] and shares["replay"] == ["-"], shares
    assert max(column(browser, "dagrl-rates", "sample_hz")) > 0
    disk = column(browser, "dagrl-replay", "disk")
    wait_for(lambda: max(column(browser, "dagrl-replay", "disk")) > 0, 90, "replay rows spilled to disk")
    assert "iteration" in browser.execute_script("return Bokeh.documents[0].get_model_by_name('dagrl-header').text"), (
        disk
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "rl-page.png"))

    # Dask's own Task Stream shows training: fragment tasks named after fragment and role
    browser.get(f"{base}/individual-task-stream")
    names = """
        const out = [];
        if (!window.Bokeh || !Bokeh.documents.length) { return out; }  // still loading
        for (const m of Bokeh.documents[0].all_models) {
            if (m.data && m.data.name) { out.push(...Array.from(m.data.name)); }
        }
        return out;
    """
    seen = wait_for(
        lambda: {n for n in browser.execute_script(names) if n.startswith(("collect-", "update-", "add-"))} >= {
            "collect-sampler", "add-replay", "update-learner"
        } and browser.execute_script(names),
        120,
        "fragment tasks in the Task Stream",
    )  # fmt: skip
    assert "sample-replay" in seen
    time.sleep(2)
    assert browser.save_screenshot(str(ARTIFACTS / "task-stream.png"))


@pytest.mark.parametrize("preload", [True, False])
def test_a_scheduler_started_by_hand_has_the_page_only_with_the_preload(preload):
    import socket

    from dagrl.app.training import rl_page

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0"]
    cmd += ["--dashboard-address", f"127.0.0.1:{port}", *(["--preload", "dagrl.dashboard"] if preload else [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        link = f"http://127.0.0.1:{port}/status"
        wait_for(lambda: "could not ask" not in rl_page(link), 60, "the scheduler's dashboard")
        page = rl_page(link)
    finally:
        proc.terminate()
        proc.wait(30)
    if preload:
        assert page == f"http://127.0.0.1:{port}/individual-dagrl"
    else:
        assert page.startswith("not on this scheduler; start it with `dask scheduler --preload dagrl.dashboard`")


class Events:
    """A scheduler's event log, as the page reads it (``get_events``)."""

    def __init__(self):
        self.log = {METRICS: [], ACTORS: []}

    def get_events(self, topic):
        return list(self.log[topic])

    def rows(self, t, run, *returns):
        rows = [{"row": {"iteration": i, "env_steps": 100 * i, "charts/episode_return_mean": r}} for i, r in returns]
        self.log[METRICS].append((t, {"run": run, "rows": rows}))


def test_the_page_follows_the_newest_run_and_plots_every_run_side_by_side():
    """Trials of a sweep publish at once: the page follows the newest to start, draws each run's mean
    return in the plot of every run, and moves to another run only once the followed one went quiet."""
    from dagrl.dashboard.page import QUIET_S, RLPage

    events = Events()
    page = RLPage(events)
    events.rows(1.0, "trial-a", (1, 10.0), (2, 12.0))
    events.rows(2.0, "trial-b", (1, 20.0))
    page.update()
    assert page.run == "trial-b" and page.curve.data["ret"] == [20.0]
    events.rows(3.0, "trial-a", (3, 14.0))  # the older trial goes on: its rows do not take the page over
    events.rows(4.0, "trial-b", (2, 22.0))
    page.update()
    assert page.run == "trial-b" and page.curve.data["ret"] == [20.0, 22.0]
    runs = dict(zip(page.runs.data["run"], page.runs.data["ret"], strict=True))
    assert runs == {"trial-a": [10.0, 12.0, 14.0], "trial-b": [20.0, 22.0]}
    assert dict(zip(page.runs.data["run"], page.runs.data["steps"], strict=True))["trial-a"] == [100, 200, 300]
    assert len(set(page.runs.data["color"])) == 2
    events.rows(4.0 + QUIET_S + 1, "trial-a", (4, 16.0))  # trial-b ended: the one still running is followed
    page.update()
    assert page.run == "trial-a" and page.curve.data["ret"] == [16.0]


def test_the_page_plots_each_agents_and_groups_return_of_a_multiagent_run():
    from dagrl.dashboard.page import RLPage

    events = Events()
    page = RLPage(events)
    row = {"iteration": 1, "env_steps": 400, "charts/episode_return_mean": -20.0}
    row |= {"agents/agent_0/episode_return": -19.0, "agents/agent_1/episode_return": -21.0}
    row |= {"groups/agent/episode_return": -20.0, "losses/policy": 0.1, "samplers/active": 3.0}
    events.log[METRICS].append((1.0, {"run": "ma", "rows": [{"row": row}]}))
    page.update()
    got = dict(zip(page.agents.data["label"], page.agents.data["ret"], strict=True))
    assert got == {"agents/agent_0": -19.0, "agents/agent_1": -21.0, "groups/agent": -20.0}
    assert page.agents.data["steps"] == [400] * 3
    assert "3 samplers" in page.header.text  # a stream's sampler count (it grows under max_replicas)


def test_the_page_plots_each_learner_replicas_busy_share_and_the_groups_update_rate():
    from dagrl.dashboard.page import RLPage

    events = Events()
    page = RLPage(events)
    row = {"iteration": 1, "env_steps": 256, "time_s": 3.0, "perf/update_hz": 5120.0}
    row |= {"learners/0/busy": 0.9, "learners/1/busy": 0.8}
    events.log[METRICS].append((1.0, {"run": "group", "rows": [{"row": row}]}))
    page.update()
    got = dict(zip(page.learners.data["label"], page.learners.data["busy"], strict=True))
    assert got == {"learners/0": 90.0, "learners/1": 80.0}
    assert page.learners.data["t"] == [3.0, 3.0] and page.rates.data["update_hz"] == [5120.0]
