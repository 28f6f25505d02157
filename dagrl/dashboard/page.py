"""The bokeh document behind ``/individual-dagrl``: learning curve, throughput, staleness, actors, replay,
central inference."""

from __future__ import annotations

from typing import Any

from dagrl.dashboard.topics import ACTORS, METRICS

INTERVAL_MS = 1000
ROLLOVER = {
    "episodes": 3_000, "curve": 5_000, "evals": 2_000, "rates": 5_000, "stale": 5_000, "replay": 5_000,
    "inference": 5_000, "agents": 5_000, "learners": 5_000,
}  # fmt: skip
"""Points kept per plot: the browser redraws them all on every update."""
SAMPLER_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
"""Episode points are coloured by the sampler replica that produced them."""
RUN_COLORS = ("#d62728", *SAMPLER_COLORS, "#7f7f7f")
RUN_POINTS = 2_000
"""Points kept per run in the plot of every run's mean return."""
QUIET_S = 10.0
"""A run that sent nothing for this long is no longer followed once another run publishes."""
STALENESS_KEYS = ("perf/staleness", "perf/weights_lag")
EVAL_KEYS = ("eval/return_mean", "eval/return")


class RLPage:
    """Plots one run in full and every run's mean return (a sweep's trials side by side).

    The run followed is the newest to start publishing on this scheduler; another run already seen
    takes over only once the followed one has been quiet for :data:`QUIET_S` (so trials publishing at
    once do not make the page jump between them with every event)."""

    def __init__(self, scheduler: Any):
        from bokeh.layouts import column, row
        from bokeh.models import ColumnDataSource, DataTable, Div, HoverTool, Legend, TableColumn
        from bokeh.plotting import figure

        self.scheduler = scheduler
        self.run: str | None = None
        self.seen = {METRICS: 0.0, ACTORS: 0.0}
        self.heard: dict[str, float] = {}
        """Per run that published, the time of its last event (its order here: the order runs started)."""
        self.curves: dict[str, tuple[list, list]] = {}

        def source(name: str, **cols: list) -> ColumnDataSource:
            return ColumnDataSource({k: [] for k in cols}, name=name)

        self.episodes = source("dagrl-episodes", steps=[], ret=[], sampler=[], color=[])
        self.curve = source("dagrl-curve", steps=[], ret=[])
        self.evals = source("dagrl-eval", steps=[], ret=[])
        self.rates = source("dagrl-rates", t=[], sample_hz=[], update_hz=[])
        self.stale = source("dagrl-staleness", t=[], staleness=[])
        self.replay = source("dagrl-replay", t=[], ram=[], disk=[])
        self.inference = source("dagrl-inference", t=[], latency_ms=[], forward_ms=[], rows=[], busy_pct=[])
        self.agents = source("dagrl-agents", steps=[], ret=[], label=[], color=[])  # multi-agent runs only
        self.learners = source("dagrl-learners", t=[], busy=[], label=[], color=[])  # learner groups only
        self.runs = source("dagrl-runs", run=[], steps=[], ret=[], color=[])  # one row per run: a multi-line
        self.table = source(
            "dagrl-actors", role=[], index=[], worker=[], device=[], state=[], heartbeat=[], calls=[], in_env=[]
        )

        self.header = Div(text="<b>dagrl</b>: waiting for a run to publish metrics", name="dagrl-header")
        kw = {"sizing_mode": "stretch_width", "height": 260, "tools": "pan,wheel_zoom,box_zoom,reset,save"}
        ret = figure(title="Episode return", x_axis_label="env steps", **kw)
        r1 = ret.scatter("steps", "ret", source=self.episodes, size=3, alpha=0.45, color="color")
        r2 = ret.line("steps", "ret", source=self.curve, line_width=2, color="#d62728")
        r3 = ret.line("steps", "ret", source=self.evals, line_width=2, color="#2ca02c", line_dash="dashed")
        ret.add_layout(
            Legend(items=[("episodes (colour: sampler)", [r1]), ("mean (window)", [r2]), ("evaluation", [r3])]),
            "right",
        )

        hz = figure(title="Throughput (Hz)", x_axis_label="seconds", **kw)
        h1 = hz.line("t", "sample_hz", source=self.rates, color="#1f77b4", line_width=2)
        h2 = hz.line("t", "update_hz", source=self.rates, color="#ff7f0e", line_width=2)
        hz.add_layout(
            Legend(items=[("env steps per second", [h1]), ("frames per second of update time", [h2])]), "right"
        )

        st = figure(title="Staleness (updates behind)", x_axis_label="seconds", **kw)
        st.line("t", "staleness", source=self.stale, color="#9467bd", line_width=2)

        rp = figure(title="Replay rows", x_axis_label="seconds", **kw)
        p1 = rp.line("t", "ram", source=self.replay, color="#8c564b", line_width=2)
        p2 = rp.line("t", "disk", source=self.replay, color="#7f7f7f", line_width=2)
        rp.add_layout(Legend(items=[("in RAM", [p1]), ("on disk", [p2])]), "right")

        inf = figure(title="Central inference (per env step)", x_axis_label="seconds", **kw)
        lines = [
            ("round trip (ms)", "latency_ms", "#1f77b4"), ("forward (ms)", "forward_ms", "#ff7f0e"),
            ("rows per forward", "rows", "#2ca02c"), ("utilisation (%)", "busy_pct", "#d62728"),
        ]  # fmt: skip
        items = [(label, [inf.line("t", col, source=self.inference, color=c, line_width=2)]) for label, col, c in lines]
        inf.add_layout(Legend(items=items), "right")

        every = figure(title="Mean return of every run (a sweep's trials)", x_axis_label="env steps", **kw)
        every.multi_line("steps", "ret", source=self.runs, line_color="color", line_width=2)
        every.add_tools(HoverTool(tooltips=[("run", "@run")]))

        per_agent = figure(title="Return per agent and group (multi-agent runs)", x_axis_label="env steps", **kw)
        per_agent.scatter("steps", "ret", source=self.agents, size=4, color="color", legend_field="label")

        group = figure(title="Learner replicas: busy share of each round (%)", x_axis_label="seconds", **kw)
        group.scatter("t", "busy", source=self.learners, size=4, color="color", legend_field="label")

        columns = [
            TableColumn(field="role", title="role"),
            TableColumn(field="index", title="#"),
            TableColumn(field="worker", title="worker"),
            TableColumn(field="device", title="device"),
            TableColumn(field="state", title="state"),
            TableColumn(field="heartbeat", title="last heartbeat"),
            TableColumn(field="calls", title="calls"),
            TableColumn(field="in_env", title="in env step"),
        ]
        actors = DataTable(
            source=self.table, columns=columns, height=200, sizing_mode="stretch_width", index_position=None
        )
        self.root = column(
            self.header, row(ret, hz, sizing_mode="stretch_width"), row(st, rp, sizing_mode="stretch_width"),
            row(inf, every, sizing_mode="stretch_width"), row(per_agent, group, sizing_mode="stretch_width"), actors,
            sizing_mode="stretch_width",
        )  # fmt: skip

    def _new(self, topic: str) -> list[tuple[float, dict]]:
        events = [(t, m) for t, m in self.scheduler.get_events(topic) if t > self.seen[topic]]
        if events:
            self.seen[topic] = events[-1][0]
        return events

    def update(self) -> None:
        """Stream what arrived since the last call: one ``stream`` per source, however many rows came."""
        batch: dict[str, dict[str, list]] = {}
        grew = False
        for t, msg in self._new(METRICS):
            run = msg.get("run")
            if run != self.run and self._takes_over(run, t):
                self._start(run)
                batch = {}
            self.heard[run] = t
            for one in msg.get("rows", [msg]):  # a feed's event holds the rows queued since its last
                grew |= self._curve(run, one)
                if run == self.run:
                    self._metrics(one, batch)
        for name, cols in batch.items():
            getattr(self, name).stream(cols, rollover=ROLLOVER[name])
        if grew:
            runs, order = list(self.curves), list(self.heard)
            self.runs.data = {  # new lists: bokeh sends a change only for a value unlike the one it had
                "run": runs,
                "steps": [list(self.curves[r][0]) for r in runs],
                "ret": [list(self.curves[r][1]) for r in runs],
                "color": [RUN_COLORS[order.index(r) % len(RUN_COLORS)] for r in runs],
            }
        for _, msg in self._new(ACTORS):
            if msg.get("run") == self.run:
                self._actors(msg)

    def _takes_over(self, run: str | None, t: float) -> bool:
        """Whether ``run``, publishing at ``t``, is followed from now on instead of :attr:`run`."""
        if run not in self.heard:  # a run that just started
            return True
        return t - self.heard.get(self.run, 0.0) > QUIET_S

    def _curve(self, run: str | None, msg: dict) -> bool:
        """Add the row's mean return to ``run``'s curve in the plot of every run; whether it had one."""
        ret = msg["row"].get("charts/episode_return_mean")
        if ret is None or run is None:
            return False
        steps, rets = self.curves.setdefault(run, ([], []))
        steps.append(msg["row"].get("env_steps", 0))
        rets.append(ret)
        if len(steps) > RUN_POINTS:
            del steps[0], rets[0]
        return True

    def _start(self, run: str | None) -> None:
        self.run = run
        for src in (
            self.episodes, self.curve, self.evals, self.rates, self.stale, self.replay, self.inference, self.agents
        ):  # fmt: skip
            src.data = {k: [] for k in src.data}

    def _metrics(self, msg: dict, batch: dict[str, dict[str, list]]) -> None:
        def add(name: str, **values: Any) -> None:
            cols = batch.setdefault(name, {k: [] for k in values})
            for k, v in values.items():
                cols[k].extend(v if isinstance(v, list) else [v])

        row = msg["row"]
        steps, t = row.get("env_steps", 0), row.get("time_s", 0.0)
        if msg.get("returns"):
            n = len(msg["returns"])
            sources = msg.get("sources") or [-1] * n
            colors = [SAMPLER_COLORS[s % len(SAMPLER_COLORS)] if s >= 0 else "#7f7f7f" for s in sources]
            add("episodes", steps=[steps] * n, ret=list(msg["returns"]), sampler=list(sources), color=colors)
        if row.get("charts/episode_return_mean") is not None:
            add("curve", steps=steps, ret=row["charts/episode_return_mean"])
        for key in EVAL_KEYS:
            if row.get(key) is not None:
                add("evals", steps=steps, ret=row[key])
                break
        sps = row.get("perf/env_steps_per_s", steps / t if t > 0 else 0.0)  # wall time: what the run makes
        add("rates", t=t, sample_hz=sps, update_hz=row.get("perf/update_hz", 0.0))
        for key in STALENESS_KEYS:
            if key in row:
                add("stale", t=t, staleness=row[key])
                break
        if "inference/forwards" in row:
            add(
                "inference", t=t, latency_ms=row.get("inference/latency_ms", 0.0),
                forward_ms=row["inference/forward_ms"], rows=row["inference/batch_rows"],
                busy_pct=100.0 * row["inference/utilisation"],
            )  # fmt: skip
        for key, value in row.items():  # agents/<agent>/episode_return, groups/<group>/episode_return
            if key.endswith("/episode_return") and key.startswith(("agents/", "groups/")) and value is not None:
                name = key.removesuffix("/episode_return")
                color = RUN_COLORS[sum(map(ord, name)) % len(RUN_COLORS)]
                add("agents", steps=steps, ret=value, label=name, color=color)
            elif key.startswith("learners/") and key.endswith("/busy"):  # a learner group's replicas
                name = key.removesuffix("/busy")
                add("learners", t=t, busy=100.0 * value, label=name, color=RUN_COLORS[int(name[9:]) % len(RUN_COLORS)])
        ret = row.get("charts/episode_return_mean")
        restarts = int(row.get("sup/restarts", 0))
        self.header.text = (
            f"<b>dagrl</b> run <code>{self.run}</code>: iteration {row.get('iteration')}, {steps:,} env steps, "
            f"mean return {'-' if ret is None else f'{ret:.1f}'}, {t:.0f} s"
            + (f", {int(row['samplers/active'])} samplers" if "samplers/active" in row else "")
            + (f", <b>{restarts} restart(s)</b>" if restarts else "")
        )
        self._last_t = t

    def _actors(self, msg: dict) -> None:
        rows = msg["actors"]
        self.table.data = {
            "role": [r["role"] for r in rows],
            "index": [r["index"] for r in rows],
            "worker": [r["worker"] for r in rows],
            "device": [r.get("device", "?") for r in rows],
            "state": [("final: " if msg.get("final") else "") + r["state"] for r in rows],
            "heartbeat": ["-" if r["heartbeat_age_s"] is None else f"{r['heartbeat_age_s']:.1f} s ago" for r in rows],
            "calls": ["-" if r["calls"] is None else str(r["calls"]) for r in rows],
            "in_env": ["-" if r.get("in_env") is None else f"{100 * r['in_env']:.0f} %" for r in rows],
        }
        stats = [r["stats"] for r in rows if r.get("stats")]
        if stats:
            t = getattr(self, "_last_t", 0.0)
            self.replay.stream(
                {"t": [t], "ram": [sum(s["hot_rows"] for s in stats)], "disk": [sum(s["cold_rows"] for s in stats)]},
                rollover=ROLLOVER["replay"],
            )


def rl_doc(scheduler: Any, extra: Any, doc: Any) -> None:
    """Bokeh document factory, as Dask's dashboard calls it for each page view."""
    page = RLPage(scheduler)
    page.update()
    doc.add_periodic_callback(page.update, INTERVAL_MS)
    doc.title = "dagrl: RL"
    doc.add_root(page.root)
