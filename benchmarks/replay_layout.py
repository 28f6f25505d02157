"""Chunk files flat (``c.<slot>.0``) or a directory each (``c/<slot>/0``): disk blocks, entries, add time.

    dagrl bench replay-layout [--rows 20000] [--image-rows 4000] [--rounds 2]

A prioritized store of image rows (84x84x4 uint8 Pong frames, as ``dagrl bench replay``; the rows
cycle through ``--image-rows`` generated ones) keeps 2-row chunks, so ``--rows`` rows are
``--rows / 2`` chunk files; its budget holds 10 % of them. Each layout fills a fresh store, flushed,
in batches of 1,000 rows; the layouts alternate within each round. Reported: the store's disk blocks
(``du``), its files and directories, and rows added per second.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _common import emit, table
from replay import image_rows, schema_of

import dagrl.replay.spill as store_module
from dagrl.replay import ReplayStore

LAYOUTS = {"flat (c.<slot>.0)": ".", "directory each (c/<slot>/0)": "/"}


def disk(path: Path) -> dict[str, int]:
    """Blocks allocated (as ``du``), files and directories under ``path``."""
    blocks, files, dirs = 0, 0, 0
    for root, _, filenames in os.walk(path):
        dirs += 1
        blocks += os.lstat(root).st_blocks
        for f in filenames:
            files += 1
            blocks += os.lstat(os.path.join(root, f)).st_blocks
    return {"disk_mib": blocks * 512 / 2**20, "files": files, "dirs": dirs}


def fill(path: Path, data: dict, rows: int, separator: str) -> dict:
    schema = schema_of(data)
    made_with, store_module.CHUNK_SEPARATOR = store_module.CHUNK_SEPARATOR, separator
    try:  # the store reads the layout once, when it creates its array
        store = ReplayStore(schema, rows, rows * schema.row_bytes // 10, path, prioritized=True)
    finally:
        store_module.CHUNK_SEPARATOR = made_with
    n = len(data["obs"])
    t0 = time.perf_counter()
    done = 0
    while done < rows:
        lo = done % n
        k = min(1000, rows - done, n - lo)
        store.add({f: v[lo : lo + k] for f, v in data.items()})
        done += k
    store.flush()
    out = {"rows_s": rows / (time.perf_counter() - t0), "chunk_rows": store.chunk_rows, **disk(path)}
    store.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--image-rows", type=int, default=4_000)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    data = image_rows(args.image_rows)
    runs: dict[str, list[dict]] = {name: [] for name in LAYOUTS}
    with tempfile.TemporaryDirectory(prefix="dagrl-bench-layout-") as tmp:
        for r in range(args.rounds):
            order = list(LAYOUTS) if r % 2 == 0 else list(reversed(LAYOUTS))
            for name in order:
                path = Path(tmp) / f"store-{r}-{LAYOUTS[name] == '.'}"
                runs[name].append(fill(path, data, args.rows, LAYOUTS[name]))
                shutil.rmtree(path)
    rows = []
    for name, got in runs.items():
        last = got[-1]
        rows.append(
            {
                "layout": name,
                "chunk rows": last["chunk_rows"],
                "disk MiB": last["disk_mib"],
                "files": last["files"],
                "dirs": last["dirs"],
                "rows/s added (median)": statistics.median(g["rows_s"] for g in got),
                "rows/s per round": " ".join(f"{g['rows_s']:.0f}" for g in got),
            }
        )
    flat, nested = rows
    print(f"prioritized image store, {args.rows:,} rows, {args.rounds} rounds")
    print(table(rows, list(rows[0])))
    ratios = {
        "disk_ratio": flat["disk MiB"] / nested["disk MiB"],
        "add_speedup": flat["rows/s added (median)"] / nested["rows/s added (median)"],
    }
    print(f"flat / directory each: disk {ratios['disk_ratio']:.2f} x, add speed {ratios['add_speedup']:.2f} x")
    emit("replay-layout", {"args": vars(args), "rows": rows, **ratios})


if __name__ == "__main__":
    main()
