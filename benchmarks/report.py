"""The benchmark reports' tables, made from the results the benchmarks keep (``benchmarks/results/<name>.json``).

    dagrl bench report           # rewrite every generated table of the reports from its JSON
    dagrl bench report --check   # exit 1, naming them, if a table differs from its JSON (the tests run this)

The reports are BENCHMARKS.md (the short one: a brief table and a reading per benchmark) and
``benchmarks/RESULTS.md`` (every table whole, with the notes of its run). A generated table sits between
``<!-- table: NAME -->`` and ``<!-- end table -->``, NAME being its JSON file's, ``NAME:brief`` for the
brief view (:data:`BRIEF`); the lines between are this script's, never typed. Each table is followed by
the command that made its JSON and the machine it ran on, both read from the JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import RESULTS

ROOT = Path(__file__).resolve().parent.parent
REPORTS = [ROOT / "BENCHMARKS.md", ROOT / "benchmarks" / "RESULTS.md"]
BLOCK = re.compile(r"(<!-- table: (?P<name>[\w.:-]+) -->\n)(?P<body>.*?)(<!-- end table -->)", re.S)


def number(v: Any) -> str:
    """A figure as the report prints it: thousands separated, three significant digits below 1,000."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    if isinstance(v, int) or abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def markdown(header: list[str], rows: list[list[Any]], right: set[int] = frozenset()) -> list[str]:
    rule = ["---:" if i in right else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    return lines + ["| " + " | ".join(number(v) for v in row) + " |" for row in rows]


def startup(r: dict) -> list[str]:
    steps = f"{r['env_steps']:,} env steps"
    names = {
        "imports": "`import dagrl.app.cli`",
        "single": f"`single`, {steps}, command to exit",
        "local": f"LocalCluster (`async`), {steps}",
    }
    rows = [[names.get(x["setup"], x["setup"]), x["median s"], x["min s"], x["target s"]] for x in r["rows"]]
    return markdown(["setup", "median s", "min s", "target s"], rows, {1, 2, 3})


def sampling(r: dict) -> list[str]:
    hz = {k: statistics.median(v) for k, v in r["runs_hz"].items()}
    names = {"plain": "plain loop, 1 process", "one": "dagrl, 1 sampler actor", "two": "dagrl, 2 sampler actors"}
    rows = [[names[k], round(v), v / hz["plain"]] for k, v in hz.items()]
    return markdown(["setup", f"env steps/s (median of {len(r['runs_hz']['plain'])})", "vs plain"], rows, {1, 2})


def workers(r: dict) -> list[str]:
    rows = [
        [x["workers"], round(x["update frames/s (median)"]) if x["update frames/s (median)"] else "",
         x["/ LocalCluster"], x["rounds"].replace(" ", ", ")]
        for x in r["rows"]
    ]  # fmt: skip
    return markdown(["workers", "update frames/s (median)", "/ LocalCluster (median)", "rounds"], rows, {1, 2})


def supervision(r: dict) -> list[str]:
    rows = [[x["role"], x["graph"], x["notice_s"], x["replace_s"], x["total_s"], x["lost"]] for x in r["rows"]]
    header = ["role lost", "graph", "fault -> noticed (s)", "noticed -> working (s)", "fault -> working (s)"]
    header.append("lost work")
    return markdown(header, rows, {2, 3, 4})


def supervision_startup(r: dict) -> list[str]:
    """The start of a run with and without a worker SIGKILLed while the roles start (medians)."""
    rows = [[r["start_s"], r["start_s_with_kill"], r["added_s"], f"{r['runs_finished']} of {r['repeats']}"]]
    header = ["start to 1st iteration (s)", "with a worker killed (s)", "added (s)", "killed runs finished"]
    return markdown(header, rows, {0, 1, 2})


def ppo_cartpole(r: dict) -> list[str]:
    rows = [
        [x["setup"], x["solved"], x["wall s (median)"], round(x["env steps (median)"]), x["time vs SB3 (median)"],
         x.get("learner busy", "")]
        for x in r["summary"]
    ]  # fmt: skip
    header = ["setup", "solved", "wall s (median)", "env steps (median)", "time / SB3 (median)", "learner busy"]
    return markdown(header, rows, {2, 3, 4, 5})


def vtrace(r: dict) -> list[str]:
    rows = [
        [x["lag"] if x["lag"] < r["args"]["iterations"] else f"{x['lag']} (first weights throughout)",
         x["vtrace"], x["uncorrected"], x["vtrace greedy"], x["uncorrected greedy"]]
        for x in r["rows"]
    ]  # fmt: skip
    header = ["lag", "V-trace, sampler", "uncorrected, sampler", "V-trace, learner greedy"]
    return markdown([*header, "uncorrected, learner greedy"], rows, {1, 2, 3, 4})


def replay(r: dict) -> list[str]:
    """Uniform draws against a numpy ring, then prioritized ones against the all-in-RAM store, per kind of row
    (np.memmap, the slower working-set rotation and the other chunkings and codecs stay in the JSON)."""
    rows = []
    for kind in ("vector", "image"):
        k = r.get(kind)
        if not k:
            continue
        what = f"{kind}, {k['rows']:,} x {k['row_bytes']:,} B"
        ring = k["numpy ring"]["sample"]
        for setup in ("numpy ring", "dagrl, all in RAM", "dagrl, 90 % spilled", "dagrl, 90 % spilled, no fsync"):
            if setup not in k:  # runs before 2026-12: no durability, nothing to compare
                continue
            rows.append([what, setup, k[setup]["add"], k[setup]["sample"], k[setup]["sample"] / ring, ""])
        per = k["prioritized"]
        ram = per["dagrl, all in RAM"]["sample"]
        spilled = next(name for name in per if "default chunks" in name)  # the default codec's: listed first
        for setup in ("dagrl, all in RAM", spilled):
            v = per[setup]
            rows.append([what, f"prioritized: {setup}", v["add"], v["sample"], "", v["sample"] / ram])
    rows = [["" if isinstance(v, float) and v != v else v for v in row] for row in rows]  # NaN: not measured
    header = ["rows", "setup", "add rows/s", "sample rows/s", "sample / numpy ring", "sample / all in RAM"]
    return markdown(header, rows, {2, 3, 4, 5})


def scaling(r: dict) -> list[str]:
    """Env steps/s by sampler count for each policy run, beside k bare processes and SB3; the driver's CPU per
    1,000 env steps (above the idle cluster's in brackets); where recorded, the learner's and all cores' busy
    shares of the run."""
    policies = r["args"]["policies"]
    busy = any(f"{p} learner busy" in x for x in r["rows"] for p in policies)  # runs since 2026-11-29
    cores = any("plain at cores" in x for x in r["rows"])  # runs since 2026-12-07
    header = ["samplers", "plain x k", "plain \\|\\| k", *(["plain at cores"] if cores else [])]
    for p in policies:
        header += [p, "eff", "/ plain\\|\\|", *(["/ plain at cores"] if cores else []), "CPU ms / 1k steps (net)"]
        header += ["learner / machine busy"] if busy else []
    sb3 = not r["args"].get("skip_sb3")
    header += ["SB3", *(f"{p} / SB3" for p in policies)] if sb3 else []
    rows = []
    for x in r["rows"]:
        row = [x["samplers"], round(x["plain x k"]), round(x["plain || k"]) if "plain || k" in x else ""]
        row += [round(x["plain at cores"]) if "plain at cores" in x else ""] if cores else []
        for p in policies:
            cpu = f"{number(x[f'{p} cpu'])} ({number(x[f'{p} net cpu'])})"
            row += [round(x[p]), x[f"{p} eff"], x.get(f"{p} / plain||", "")]
            row += [x.get(f"{p} / plain cores", "")] if cores else []
            row.append(cpu)
            if busy:
                shares = (x.get(f"{p} learner busy"), x.get(f"{p} machine busy"))
                row += [" / ".join("" if v is None else f"{v:.2f}" for v in shares)]
        row += [round(x["sb3"]) if "sb3" in x else "", *(x.get(f"{p}/sb3", "") for p in policies)] if sb3 else []
        rows.append(row)
    return markdown(header, rows, set(range(len(header))) - {0})


def transport(r: dict) -> list[str]:
    """MB/s of image-sized rollouts reaching the learner, by path, each against the raw Dask ceiling."""
    paths = [
        ("ceiling_bytes_s", "raw Dask worker to worker (the ceiling)"),
        ("peer_bytes_s", "fragments, worker to worker, same-host shared memory (the default)"),
        ("peer_socket_bytes_s", "fragments, worker to worker, `shared_memory: false`"),
        ("driver_bytes_s", "fragments as actor calls, through the driver (the path before)"),
        ("sync_mailbox_bytes_s", "`sync` iterations, same-host mailbox (the default)"),
        ("sync_dask_bytes_s", "`sync` iterations, through Dask (`mailbox: false`)"),
    ]
    ceiling = r["ceiling_bytes_s"]
    rows = [[name, r[key] / 1e6, r[key] / ceiling] for key, name in paths]
    return markdown(["path", "MB/s", "/ ceiling"], rows, {1, 2})


def sweep(r: dict) -> list[str]:
    rows = [[x["round"], x["sequential_s"], x["sweep_s"], x["speedup"], x["trial_training_s"]] for x in r["rounds"]]
    header = ["round", "one after another, s", "sweep, s", "speedup", "a trial's training in the sweep, s"]
    return markdown(header, rows, {0, 1, 2, 3, 4})


def dashboard(r: dict) -> list[str]:
    names = {
        "feed off": "feed off (no events)",
        "page closed": "feed on, page closed",
        "page served, no browser": "page served to a bokeh client, nothing renders it",
        "page open": "page open in headless Chromium on the same 2 cores",
    }
    rows = [
        [names.get(x["condition"], x["condition"]), round(x["median steps/s"]), x["vs page closed"],
         ", ".join(f"{v:,.0f}" for v in r["hz"][x["condition"]])]
        for x in r["rows"]
    ]  # fmt: skip
    return markdown(["condition", "env steps/s (median)", "/ page closed", "runs"], rows, {1, 2})


def learning(r: dict) -> list[str]:
    if any("to_target" in x for x in r["table"]):  # runs since 2026-12-07: the env steps to the graph's target
        rows = [
            [x["graph"], x["steps"], x["seeds"], x["final_return"], x["final_eval"], x["to_target"], x["published"],
             round(x["steps/s"]), f"{x['wall_s']:.0f} s"]
            for x in r["table"]
        ]  # fmt: skip
        header = ["graph", "env steps", "seeds", "final (training episodes)", "final checkpoint",
                  "env steps to target (median)", "published", "env steps/s", "wall"]  # fmt: skip
        return markdown(header, rows, {1, 2, 7, 8})
    rows = [
        [x["graph"], x["steps"], x["seeds"], x["final_return"], x["final_eval"], x["published"], round(x["steps/s"]),
         f"{x['wall_s']:.0f} s"]
        for x in r["table"]
    ]  # fmt: skip
    header = ["graph", "env steps", "seeds", "final (training episodes)", "final checkpoint", "published",
              "env steps/s", "wall"]  # fmt: skip
    return markdown(header, rows, {1, 2, 6, 7})


def sac_pendulum(r: dict) -> list[str]:
    rows = [[x["setup"], x["solved"], x["wall s (median)"], x["env steps (median)"]] for x in r["summary"]]
    lines = markdown(["setup", "solved", "wall s (median)", "env steps (median)"], rows, {2, 3})
    rate = r.get("frame_rate")
    if rate:
        lines += ["", f"Update frame rate: dagrl {number(rate['dagrl'])}/s, raw torch {number(rate['raw'])}/s."]
    return lines


def small_collects(r: dict) -> list[str]:
    """Env steps/s in one process and under ``apex``, per graph, and their ratio (median of the repeats)."""
    rows = [[x["graph"], x["env_steps"], round(x["single"]), round(x["apex"]), x["ratio"],
             ", ".join(f"{v:.2f}" for v in x["ratios"])] for x in r["rows"]]  # fmt: skip
    return markdown(["graph", "env steps", "single", "apex", "apex / single", "each repeat"], rows, {1, 2, 3, 4})


def cores(r: dict) -> list[str]:
    """A gradient step alone on core 0 and beside a process spinning on core 1, each repeat and the median."""
    rows = [[i + 1, x["alone_ms"], x["beside_ms"], x["ratio"]] for i, x in enumerate(r["rows"])]
    s = r["summary"]
    rows.append(["median", s["alone_ms"], s["beside_ms"], s["ratio"]])
    return markdown(["repeat", "alone ms", "beside a spinning core ms", "ratio"], rows, {1, 2, 3})


def dp_learners(r: dict) -> list[str]:
    rows = [[x["learners"], x["device"], round(x["frames_s"]), x["speedup"], x["step_ms"]] for x in r["rows"]]
    return markdown(["learners", "device", "frames/s", "speedup", "ms per step"], rows, {0, 2, 3, 4})


def scaling_learners(r: dict) -> list[str]:
    """``scaling --learners``: env steps/s of K learner replicas under ``async`` at each learner cost."""
    rows = [
        [x["learner us"], x["samplers"], x["learners"], round(x["steps/s"]), x["learner eff"], x["learner busy"],
         x["machine busy"]]
        for x in r["rows"]
    ]  # fmt: skip
    header = ["learner us / row", "samplers", "learners", "env steps/s", "learner eff", "learner busy", "machine busy"]
    return markdown(header, rows, set(range(7)))


def seed(r: dict) -> list[str]:
    """Env steps/s of each setup beside ``async``'s in its round; the samplers' share of ``collect`` in
    their envs; under central inference, the inference role's batches, forward, samplers' round trip and
    the share of the run it was busy."""
    rows = [
        [x["round"], x["policy"], round(x["steps_s"]), x.get("/ async", ""), x["sampler_in_env"],
         *(x.get(f"inference {k}", "") for k in ("batch_rows", "forward_ms", "latency_ms", "utilisation"))]
        for x in r["rows"]
    ]  # fmt: skip
    header = ["round", "setup", "env steps/s", "/ async", "samplers in env", "rows per forward", "forward (ms)",
              "round trip (ms)", "inference busy"]  # fmt: skip
    return markdown(header, rows, set(range(2, 9)))


def encoders(r: dict) -> list[str]:
    rows = [
        [x["cnn"], f"{x['params'] / 1e6:.2f}M", x["forward_ms"], x["fwd_bwd_ms"], x["env_step_ms"], x["forward_share"],
         x["forward / nature"], x["fwd_bwd / nature"]]
        for x in r["rows"]
    ]  # fmt: skip
    a = r["args"]
    header = ["cnn", "params", f"forward, {a['envs']} rows (ms)", f"fwd + bwd, {a['batch']} rows (ms)",
              "env step (ms)", "forward's share of a step", "forward / nature", "fwd + bwd / nature"]  # fmt: skip
    return markdown(header, rows, set(range(1, 8)))


def vector(r: dict) -> list[str]:
    rows = [
        [task, what, round(rates["sync"]), round(rates["envpool"]), rates["envpool_vs_sync"]]
        for task, kinds in r["tasks"].items()
        for what, rates in kinds.items()
    ]
    header = [f"task ({r['envs']} envs)", "env steps/s of", "gymnasium `sync`", "`envpool`", "envpool / sync"]
    return markdown(header, rows, {2, 3, 4})


def impala_stability(r: dict) -> list[str]:
    header = [k for k in r["rows"][0] if k != "overrides"]
    rows = [[x[k] if x[k] is not None else "-" for k in header] for x in r["rows"]]
    return markdown(header, rows, {1, 2, 3, 4, 5})


def tune(r: dict) -> list[str]:
    """Times to target, and how far the tuner's predicted env steps/s were off for the candidates it
    verified (the calibration run aside, which matches by construction)."""
    errors = {x["graph"]: [abs(v["error"]) for v in r["verified"] if v["graph"] == x["graph"]] for x in r["graphs"]}
    rows = [
        [x["graph"], x["as_written_s"], x["single_s"], x["tuned_s"], x["tuned_vs_best"], f"`{x['tuned']}`",
         f"{min(errors[x['graph']]):.0%}-{max(errors[x['graph']]):.0%} ({len(errors[x['graph']])})"
         if errors[x["graph"]] else "-"]
        for x in r["graphs"]
    ]  # fmt: skip
    header = ["graph", f"as written, s to target (median of {len(r['seeds'])})", "`single`, s", "tuned, s",
              "tuned / best other", "tuned setting", "predictions off by (candidates)"]  # fmt: skip
    return markdown(header, rows, {1, 2, 3, 4, 6})


def scaling_brief(r: dict) -> list[str]:
    """:func:`scaling` cut to the throughput: env steps/s by sampler count, against k bare processes and SB3."""
    policies = r["args"]["policies"]
    sb3 = not r["args"].get("skip_sb3") and any("sb3" in x for x in r["rows"])
    cores = any("plain at cores" in x for x in r["rows"])  # runs since 2026-12-07
    header = ["samplers", "plain \\|\\| k", *(["plain at cores"] if cores else []), *policies]
    header += [f"{policies[0]} / plain\\|\\|", *([f"{policies[0]} / plain at cores"] if cores else [])]
    header += ["SB3", *(f"{p} / SB3" for p in policies)] if sb3 else []
    rows = []
    for x in r["rows"]:
        row = [x["samplers"], round(x["plain || k"]) if "plain || k" in x else ""]
        row += [round(x["plain at cores"]) if "plain at cores" in x else ""] if cores else []
        row += [round(x[p]) for p in policies]
        row.append(x.get(f"{policies[0]} / plain||", ""))
        row += [x.get(f"{policies[0]} / plain cores", "")] if cores else []
        row += [round(x["sb3"]) if "sb3" in x else "", *(x.get(f"{p}/sb3", "") for p in policies)] if sb3 else []
        rows.append(row)
    return markdown(header, rows, set(range(len(header))) - {0})


def replay_brief(r: dict) -> list[str]:
    """:func:`replay` cut to uniform draws: a store all in RAM and one 90 % spilled, against a numpy ring."""
    rows = []
    for kind in ("vector", "image"):
        k = r.get(kind)
        if not k:
            continue
        ring = k["numpy ring"]["sample"]
        for setup in ("dagrl, all in RAM", "dagrl, 90 % spilled"):
            rows.append(
                [
                    f"{kind} ({k['row_bytes']:,} B)",
                    setup,
                    k[setup]["add"],
                    k[setup]["sample"],
                    k[setup]["sample"] / ring,
                ]
            )
    return markdown(["rows", "store", "add rows/s", "sample rows/s", "sample / numpy ring"], rows, {2, 3, 4})


def supervision_brief(r: dict) -> list[str]:
    """:func:`supervision` cut to the time from the fault to a working replacement."""
    rows = [[x["role"], x["graph"], x["notice_s"], x["total_s"]] for x in r["rows"]]
    return markdown(["role lost", "graph", "fault -> noticed (s)", "fault -> working (s)"], rows, {2, 3})


BRIEF: dict[str, Callable[[dict], list[str]]] = {
    "scaling-0.2ms": scaling_brief,
    "scaling-5ms": scaling_brief,
    "scaling-1ms": scaling_brief,
    "scaling-10ms": scaling_brief,
    "replay": replay_brief,
    "supervision": supervision_brief,
    "supervision-hosts": supervision_brief,
}
"""The brief views BENCHMARKS.md shows (``<!-- table: NAME:brief -->``); RESULTS.md has the tables whole."""


RENDER: dict[str, Callable[[dict], list[str]]] = {
    "impala-stability": impala_stability,
    "tune": tune,
    "learning": learning,
    "dp-learners": dp_learners,
    "encoders": encoders,
    "vector": vector,
    "startup": startup,
    "sampling": sampling,
    "workers": workers,
    "supervision": supervision,
    "supervision-hosts": supervision,
    "supervision-startup": supervision_startup,
    "ppo-cartpole": ppo_cartpole,
    "vtrace": vtrace,
    "replay": replay,
    "transport": transport,
    "sweep": sweep,
    "dashboard": dashboard,
    "scaling-1ms": scaling,
    "scaling-10ms": scaling,
    "scaling-10ms-16cores": scaling,
    "scaling-0.2ms": scaling,
    "scaling-5ms": scaling,
    "scaling-2ms": scaling,
    "learning-acrobot": learning,
    "scaling-learners": scaling_learners,
    "seed": seed,
    "learning-multiagent": learning,
    "sac-pendulum": sac_pendulum,
    "small-collects": small_collects,
    "cores": cores,
    "learning-zoo": learning,
}


def provenance(r: dict) -> str:
    """The command that made ``r`` (as ``dagrl bench``) and the machine, from the JSON."""
    script, *args = r["command"].split()
    name = Path(script).stem.replace("_", "-")
    if "--out" in args:  # where that run wrote its files: nothing of the result
        at = args.index("--out")
        del args[at : at + 2]
    m = r["machine"]
    return (
        f"`dagrl bench {' '.join([name, *args])}`; {m['cpus']} CPUs, torch {m['torch']}, "
        f"{m['cuda'] or 'no GPU'}, load {m['load_avg_at_start']:.1f} at the start."
    )


def block(name: str) -> str:
    base, _, view = name.partition(":")
    renderers = BRIEF if view == "brief" else RENDER
    path = RESULTS / f"{base}.json"
    if base not in renderers or view not in ("", "brief"):
        raise SystemExit(f"table {name!r} has no renderer in {Path(__file__).name}")
    if not path.exists():
        raise SystemExit(f"table {name!r}: no {path}")
    result = json.loads(path.read_text())
    return "\n".join([*renderers[base](result), "", f"From `benchmarks/results/{base}.json`: {provenance(result)}\n"])


def render(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + block(m.group("name")) + m.group(4), text)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs from its JSON")
    args = p.parse_args()
    code = 0
    for report in REPORTS:
        text = report.read_text()
        new = render(text)
        stale = [
            m.group("name")
            for m, n in zip(BLOCK.finditer(text), BLOCK.finditer(new), strict=True)
            if m.group(0) != n.group(0)
        ]
        where, count = report.relative_to(ROOT), len(BLOCK.findall(text))
        if args.check:
            if stale:
                print(f"{where}: tables not as their JSON gives them: {', '.join(stale)} (run `dagrl bench report`)")
                code = 1
            else:
                print(f"{where}: {count} generated tables match their JSON")
            continue
        report.write_text(new)
        print(f"{where}: {len(stale)} of {count} generated tables rewritten")
    return code


if __name__ == "__main__":
    sys.exit(main())
