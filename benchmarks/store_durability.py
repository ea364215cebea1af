"""What ``synchronous=FULL`` costs the results store, against the ``NORMAL`` it replaced.

Why this exists: ``store.py`` promises that a record survives a power cut once
``add_record`` returns. Under WAL, ``synchronous=NORMAL`` syncs only at checkpoints, so the
last commits before a power cut can be lost (the file stays consistent); ``FULL`` syncs the
WAL on every commit. That is one fsync per record, and this script measures what it costs,
side by side in one run so both modes see the same disk and the same load.

It opens two stores in a temporary folder on the filesystem of the results database
(``paths.data_dir()``, or ``--dir``: fsync on a tmpfs costs nothing and would prove nothing),
switches one connection back to ``NORMAL``, and appends ``--records`` bench records of a
1,000-token reply (the shape ``records.request`` stores, arrival list included) to each, in
alternating blocks of ``--block`` so drift in the machine's load hits both modes alike.
Prints a markdown table (per-record latency median / p95 / max and records per second);
``--out-json`` keeps the raw per-record times. Run:

    .venv/bin/python benchmarks/store_durability.py [--records 2000] [--block 100] [--dir DIR] \
        [--out-json benchmarks/data/store_durability.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from engineroom import paths
from engineroom.records.encoding import encode_arrivals
from engineroom.records.request import BenchRequest
from engineroom.store import Store

MODES = ("NORMAL", "FULL")


def sample_record(rng: random.Random, index: int) -> dict:
    """A bench record the size a 1,000-token reply stores (gaps of ~9 ms, jittered)."""
    times, t = [], 0.018
    for _ in range(1000):
        times.append(t)
        t += rng.uniform(0.0085, 0.0095)
    return BenchRequest(
        workload="narrative", index=index, warmup=False,
        sent={"max_tokens": 1000, "sampler": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
                                              "seed": 1234}, "body": {}, "prompt_sha256": "0123456789abcdef"},
        sent_unix=time.time(), status=200, error=None, end_us=round((t + 0.001) * 1e6),
        arrivals_us=encode_arrivals(0.0, times), completion_tokens=1000, prompt_tokens=79, finish_reason="length",
        chunks=1002, content_chars=4900, engine={"decode_tokens": 1000, "decode_ms": 8990.0}, engine_raw=None,
    ).to_dict()


def measure(folder: Path, records: int, block: int) -> dict[str, list[float]]:
    rng = random.Random(7)
    payloads = [sample_record(rng, i) for i in range(block)]
    stores = {mode: Store(folder / f"{mode.lower()}.sqlite") for mode in MODES}
    # the store always opens FULL; the benchmark alone turns one connection back to the old setting
    stores["NORMAL"]._db.execute("PRAGMA synchronous=NORMAL")
    for mode, store in stores.items():
        level = store._db.execute("PRAGMA synchronous").fetchone()[0]
        assert level == {"NORMAL": 1, "FULL": 2}[mode], (mode, level)
    runs = {mode: store.start_run("bench", {"benchmark": "store_durability"}) for mode, store in stores.items()}
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    done = 0
    while done < records:
        for mode in MODES if (done // block) % 2 == 0 else reversed(MODES):   # alternate who goes first
            store, run_id = stores[mode], runs[mode]
            for payload in payloads[: min(block, records - done)]:
                t0 = time.perf_counter()
                store.add_record(run_id, "bench_request", payload)
                times[mode].append(time.perf_counter() - t0)
        done += block
    for store in stores.values():
        store.close()
    return times


def table(times: dict[str, list[float]]) -> list[str]:
    out = ["| synchronous | records | median ms | mean ms | p95 ms | max ms | records / s |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for mode in MODES:
        xs = sorted(times[mode])
        p95 = xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]
        out.append(f"| {mode} | {len(xs)} | {statistics.median(xs) * 1000:.3f} | {statistics.fmean(xs) * 1000:.3f} | "
                   f"{p95 * 1000:.3f} | "
                   f"{xs[-1] * 1000:.2f} | {len(xs) / sum(xs):.0f} |")
    out.append("")
    for name, fn in (("median", statistics.median), ("mean", statistics.fmean)):
        full, normal = fn(times["FULL"]), fn(times["NORMAL"])
        out.append(f"FULL / NORMAL {name} per record: {full / normal:.2f}x "
                   f"(+{(full - normal) * 1000:.3f} ms a record).")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2000, help="records per mode")
    ap.add_argument("--block", type=int, default=100, help="records per mode before switching to the other")
    ap.add_argument("--dir", type=Path, help="where the two databases go (default: beside the results database)")
    ap.add_argument("--out-json", type=Path)
    args = ap.parse_args()
    if args.records < 1 or args.block < 1:
        print("--records and --block must be at least 1.", file=sys.stderr)
        return 2
    base = args.dir or paths.data_dir()
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="store-durability-", dir=base) as folder:
        t0 = time.time()
        times = measure(Path(folder), args.records, args.block)
        seconds = time.time() - t0
        record_bytes = len(json.dumps(sample_record(random.Random(7), 0), separators=(",", ":")))
    meta = {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(),
            "sqlite": __import__("sqlite3").sqlite_version,
            "machine": platform.machine(), "cpu_count": os.cpu_count(), "dir": str(base), "record_bytes": record_bytes,
            "seconds": round(seconds, 1), "argv": sys.argv[1:]}
    print(f"{args.records} records of {record_bytes} bytes per mode, in {base} (SQLite {meta['sqlite']})")
    print("\n".join(table(times)))
    print(f"({meta['seconds']} s)")
    if args.out_json:
        args.out_json.write_text(json.dumps({"meta": meta, "seconds": times}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
