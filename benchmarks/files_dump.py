"""A file partner's full dump of several gigabytes: memory, speed against a raw COPY, a kill mid-file.

    .venv/bin/python benchmarks/files_dump.py                  # 2 GB and 200 MB CSV dumps
    .venv/bin/python benchmarks/files_dump.py --big-mb 300 --small-mb 30   # a quick look

Generates two CSV dumps of the same museum-like rows (never committed: written under
``--dir``, removed afterwards unless ``--keep``) and, in the same run and database:

1. the baseline: the big file streamed into PostgreSQL with a raw ``COPY ... FROM STDIN
   (FORMAT csv, HEADER)`` into an UNLOGGED table of its columns (staging is UNLOGGED too);
2. the small and the big dump staged by the run recipe (``run.freeze`` + ``run.stage_channel``,
   what the DAG's tasks call), each in a fresh process: rows/s, the process's own CPU time a
   row (ours, not the server's) and its peak RSS;
3. the staging floor: the big dump's staged rows inserted again into staging under another
   run (no parsing, no JSON, no hash, no network): what writing the finished rows costs the
   server, whoever builds them; and the raw COPY again (the machine's load moves);
4. the big dump again, the process killed (SIGKILL) once about half of it is staged, then a
   new process resuming the same frozen window: where it entered the file, and whether
   staging then holds each row exactly once.

Each figure carries the load average when it was taken (``os.getloadavg``): the machine is shared.

The apply is not timed (benchmarks/sierra_full_load.py and apply_statistics.py time applies).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from benchmarks.support import child_arguments, fresh_database, partner, peak_rss_mib  # noqa: E402

PARTNER = "bench_files"
DAY = "20260619"
COLUMNS = ("object_id", "title", "maker", "maker_dates", "date", "medium", "dimensions", "credit_line",
           "classification", "department", "accession_number", "rights", "deleted")
WORDS = ("still life", "landscape", "portrait", "river", "winter", "allegory", "study", "interior", "harbour",
         "flowers", "saint", "evening")


def generate(path: Path, megabytes: int, seed: int = 1) -> int:
    """A CSV dump of about ``megabytes`` MB; returns its rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    target = megabytes * 1024 * 1024
    written, rows = 0, 0
    with path.open("wb", buffering=16 * 1024 * 1024) as out:
        header = (",".join(COLUMNS) + "\r\n").encode()
        out.write(header)
        written += len(header)
        block: list[str] = []
        while written < target:
            rows += 1
            title = " ".join(rng.choice(WORDS) for _ in range(4)).capitalize()
            line = (f'BM-{rows:09d},"{title}, with ""quotes"", and commas",'
                    f'"Maker {rng.randint(1, 5000)}, Workshop of","Dutch, {rng.randint(1500, 1700)} - '
                    f'{rng.randint(1700, 1800)}",{rng.randint(1550, 1800)},oil on canvas,'
                    f'"{rng.randint(10, 300)} x {rng.randint(10, 300)} cm","Gift of the Friends of the Museum, '
                    f'{rng.randint(1900, 2020)}",Painting,European Paintings,{rng.randint(1900, 2020)}.'
                    f'{rng.randint(1, 999)}.{rng.randint(1, 99)},Public domain,\r\n')
            block.append(line)
            written += len(line)
            if len(block) >= 10_000:
                out.write("".join(block).encode())
                block = []
        out.write("".join(block).encode())
    return rows


def raw_copy(db: str, path: Path) -> dict:
    """The baseline: the file as is into an UNLOGGED table with COPY (FORMAT csv, HEADER)."""
    import psycopg

    with psycopg.connect(db) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_raw_copy")
        conn.execute("CREATE UNLOGGED TABLE bench_raw_copy (" + ", ".join(f"{c} text" for c in COLUMNS) + ")")
        conn.commit()
        started = time.perf_counter()
        with conn.cursor() as cur, cur.copy("COPY bench_raw_copy FROM STDIN (FORMAT csv, HEADER true)") as copy, \
                path.open("rb") as source:
            while chunk := source.read(8 * 1024 * 1024):
                copy.write(chunk)
        conn.commit()
        seconds = time.perf_counter() - started
        rows = conn.execute("SELECT count(*) FROM bench_raw_copy").fetchone()[0]  # type: ignore[index]
        conn.execute("DROP TABLE bench_raw_copy")
    return {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds, "load": os.getloadavg()[0]}


def the_partner(location: Path) -> tuple[Any, str]:
    from include.simulators.files.publisher import OPTIONS

    return partner(id=PARTNER, protocol="file-delivery", options={"files": {**OPTIONS, "done_marker": None}}), \
        f"file://{location}"


def child(args: argparse.Namespace) -> None:
    """Freeze (or read the frozen window) and stage the changes channel; report rows/s and peak RSS."""
    from partner_harvest import run
    from partner_harvest.factory import Endpoint, build_adapter
    from partner_harvest.files import readers
    from partner_harvest.store import connect
    from partner_harvest.window import Window

    location = Path(args.url)
    subject, url = the_partner(location)
    adapter = build_adapter(subject, Endpoint(url))
    entered: list[int] = []
    real = readers.FileReader.read

    def noting(self: Any, storage: Any, path: str, stamp: Any, start: int, digest: Any = None) -> Any:  # where each file is entered
        entered.append(start)
        return real(self, storage, path, stamp, start, digest)

    readers.FileReader.read = noting  # type: ignore[method-assign]
    with connect(args.db) as conn:
        window_file = Path(args.window)
        if window_file.exists():
            window = Window.from_dict(json.loads(window_file.read_text()))
        else:
            window = run.freeze(subject, adapter, conn)
            window_file.write_text(json.dumps(window.to_dict()))
        started, cpu = time.perf_counter(), time.process_time()
        stats = run.stage_channel(adapter, conn, args.run_id, window, run.CHANGES)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(json.dumps({"fetched": stats.fetched, "seconds": seconds, "rows_per_s": stats.fetched / seconds,
                      "cpu_us_per_row": cpu / max(stats.fetched, 1) * 1e6, "peak_rss_mib": peak_rss_mib(),
                      "entered_at": entered, "load": os.getloadavg()[0]}))


def stage(script: str, db: str, location: Path, run_id: str, window: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, script, "--child", "--url", str(location), "--db", db, "--run-id",
                             run_id, "--window", str(window)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finished(process: subprocess.Popen) -> dict:
    out, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"child failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def staging_floor(db: str, run_id: str) -> dict:
    """What writing the finished staging rows costs the server, whoever builds them: the run's
    rows inserted again into staging under another run (no parsing, no JSON, no hash, no network)."""
    import psycopg

    from partner_harvest.store.staging import COLUMNS

    columns = ", ".join(c for c in COLUMNS if c != "run_id")
    with psycopg.connect(db) as conn:
        started = time.perf_counter()
        rows = conn.execute(f"INSERT INTO staging (run_id, {columns}) SELECT 'bench-floor', {columns} FROM staging "
                            "WHERE partner_id = %s AND run_id = %s", (PARTNER, run_id)).rowcount
        conn.commit()
        seconds = time.perf_counter() - started
    drop(db, "bench-floor")
    return {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds, "load": os.getloadavg()[0]}


def staged(db: str, run_id: str) -> tuple[int, int, int]:
    """(rows staged, distinct identifiers, the channel's recorded fetched) of the run."""
    import psycopg

    with psycopg.connect(db) as conn:
        rows, distinct = conn.execute("SELECT count(*), count(DISTINCT identifier) FROM staging WHERE partner_id = %s"
                                      " AND run_id = %s", (PARTNER, run_id)).fetchone()  # type: ignore[misc]
        fetched = conn.execute("SELECT COALESCE(max(fetched), 0) FROM harvest_runs WHERE partner_id = %s AND "
                               "run_id = %s", (PARTNER, run_id)).fetchone()[0]  # type: ignore[index]
    return rows, distinct, fetched


def drop(db: str, run_id: str) -> None:
    import psycopg

    with psycopg.connect(db) as conn:
        conn.execute("DELETE FROM staging WHERE partner_id = %s AND run_id = %s", (PARTNER, run_id))
        conn.execute("DELETE FROM harvest_runs WHERE partner_id = %s AND run_id = %s", (PARTNER, run_id))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--big-mb", type=int, default=2048)
    parser.add_argument("--small-mb", type=int, default=200)
    parser.add_argument("--dir", default="/tmp/ph-files-bench")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    child_arguments(parser, "--window")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    script = os.path.abspath(__file__)
    base = Path(args.dir)
    db = fresh_database(PARTNER)
    result: dict = {}
    try:
        sizes = {"small": args.small_mb, "big": args.big_mb}
        files = {}
        for name, megabytes in sizes.items():
            path = base / name / DAY / "full" / "objects-001.csv"
            started = time.perf_counter()
            rows = generate(path, megabytes)
            files[name] = (path, rows)
            print(f"generated {name}: {path.stat().st_size / 1e6:.0f} MB, {rows} rows in "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
        big_path, big_rows = files["big"]
        result["raw_copy"] = raw_copy(db, big_path)
        print("raw COPY:", result["raw_copy"], flush=True)
        for name in ("small", "big"):
            window = base / f"{name}.window.json"
            window.unlink(missing_ok=True)
            result[name] = finished(stage(script, db, base / name, f"bench-{name}", window))
            result[name]["rows"] = files[name][1]
            print(name, result[name], flush=True)
            if name == "big":
                result["staging_floor"] = staging_floor(db, "bench-big")
                print("staging floor:", result["staging_floor"], flush=True)
            drop(db, f"bench-{name}")
        result["ratio_big_vs_raw_copy"] = result["big"]["rows_per_s"] / result["raw_copy"]["rows_per_s"]
        result["raw_copy_again"] = raw_copy(db, big_path)
        print("raw COPY again:", result["raw_copy_again"], flush=True)

        window = base / "kill.window.json"
        window.unlink(missing_ok=True)
        victim = stage(script, db, base / "big", "bench-kill", window)
        while True:
            time.sleep(0.5)
            rows, _, _ = staged(db, "bench-kill")
            if rows >= big_rows // 2 or victim.poll() is not None:
                break
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        at_kill = staged(db, "bench-kill")
        resumed = finished(stage(script, db, base / "big", "bench-kill", window))
        rows, distinct, fetched = staged(db, "bench-kill")
        resumed["rows_per_s"] = (rows - at_kill[0]) / resumed["seconds"]  # the rows this try staged
        resumed["cpu_us_per_row"] *= resumed["fetched"] / max(rows - at_kill[0], 1)
        result["kill"] = {"staged_at_kill": at_kill[0], "resumed": resumed, "staged_after": rows,
                          "distinct_after": distinct, "recorded_fetched": fetched, "file_rows": big_rows,
                          "exact": rows == distinct == fetched == big_rows}
        print("kill:", result["kill"], flush=True)
        drop(db, "bench-kill")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        vacuum(db)
    print(json.dumps(result, indent=2))


def vacuum(db: str) -> None:
    """Give back the disk the deleted staging rows hold (17 GB after a 2 GB run): VACUUM cuts a
    table's empty tail off."""
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("VACUUM staging")


if __name__ == "__main__":
    main()
