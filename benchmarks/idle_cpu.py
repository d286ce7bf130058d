"""What an idle Airflow costs per hour, with and without the idle settings of airflow.cfg.example.

Two real stacks side by side in the same minutes (tests/support/airflow_stack.py through
benchmarks/many_partners.py: api-server, scheduler, dag-processor and triggerer, LocalExecutor,
each with a PostgreSQL server of its own), the same partners and DAG files, no run at all:

- ``before``: Airflow 3.3's defaults, but for the parse settings this project sets
  (``min_file_process_interval`` and the other keys in :data:`PARSE_KEYS`);
- ``after``: every key of the ``[dag_processor]``, ``[scheduler]`` and ``[triggerer]``
  sections of this checkout's ``airflow.cfg.example``.

CPU-seconds from /proc (user + system, reaped children included) per service, per hour,
then the daily fixed cost per partner at 100, 1,000 and 10,000 partners.

    .venv/bin/python benchmarks/idle_cpu.py --partners 10 --minutes 20
    .venv/bin/python benchmarks/idle_cpu.py --partners 1000 --shards 8 --minutes 10
    .venv/bin/python benchmarks/idle_cpu.py --minutes 3 --profile /tmp/idle-profile   # py-spy, top frames

``--profile`` needs py-spy (``pip install py-spy``; not a project dependency) and ptrace rights.
"""

from __future__ import annotations

import argparse
import configparser
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
from benchmarks.many_partners import ManyPartners, cpu_snapshot, delta, write_registry  # noqa: E402
from benchmarks.support import ROOT  # noqa: E402
from include import embedded_pg
from tests.support.airflow_stack import SERVICES, TRIGGERER

PARSE_KEYS = ("min_file_process_interval", "file_parsing_sort_mode", "dag_file_processor_timeout",
              "parsing_processes")
IDLE_SECTIONS = ("dag_processor", "scheduler", "triggerer")
SCALES = (100, 1000, 10000)


def example_settings(sections: tuple[str, ...], only: tuple[str, ...] | None = None) -> dict[str, str]:
    """AIRFLOW__* variables for the keys of ``sections`` in airflow.cfg.example (``only``: these keys)."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "airflow.cfg.example")
    env = {}
    for section in sections:
        if parser.has_section(section):
            for key, value in parser.items(section):
                if only is None or key in only:
                    env[f"AIRFLOW__{section.upper()}__{key.upper()}"] = value
    return env


def variants() -> dict[str, dict[str, str]]:
    return {"before": example_settings(("dag_processor",), PARSE_KEYS), "after": example_settings(IDLE_SECTIONS)}


# ---------------------------------------------------------------------------- profiling
def profile(pid: int, seconds: int, out: Path) -> subprocess.Popen | None:
    """py-spy sampling ``pid`` and its children without pausing them (raw collapsed stacks)."""
    spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    if spy is None:
        print("py-spy not installed: no profile")
        return None
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "50",
                             "--subprocesses", "--nonblocking", "--format", "raw", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def top_frames(collapsed: Path, count: int = 25) -> str:
    """The frames most often on the stack (inclusive) and on top of it (self), in samples."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")
        samples = int(n)
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    lines = [f"{total} samples"]
    lines += [f"  incl {n:6d} {n * 100 / max(total, 1):5.1f}%  {f}" for f, n in inclusive.most_common(count)]
    lines += [f"  self {n:6d} {n * 100 / max(total, 1):5.1f}%  {f}" for f, n in own.most_common(count)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- what must still work
def reactions(stack: ManyPartners) -> dict[str, float]:
    """Seconds until a partner added to the registry has its DAG (after ``partner-harvest shards --touch``, the
    documented step), and the wall time of one partner's first run (six tasks, each handed on
    by the scheduler's loop)."""
    added = "pnew01"
    registry = stack.work / "partners.yaml"
    write_registry(registry, [*stack.ids, added])
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "partner_harvest.cli", "shards", "--touch", str(stack.work / "dags")],
                   env=stack.stack.env, check=True, stdout=subprocess.DEVNULL)
    stack.stack.poll(lambda: stack.stack.dag_parsed(f"harvest_{added}"), 600, "the added partner's DAG")
    seen = time.monotonic() - started
    logical = datetime.now(timezone.utc)
    started = time.monotonic()
    dag_id = f"harvest_{stack.ids[0]}"
    stack._api("POST", f"/dags/{dag_id}/dagRuns",
               json={"dag_run_id": "idle__first", "logical_date": logical.isoformat(), "conf": {}})
    run = stack.stack.poll(lambda: (r := stack._api("GET", f"/dags/{dag_id}/dagRuns/idle__first"))["state"]
                           in ("success", "failed") and r, 900, "the first run to finish")
    return {"registry change seen": seen, "first run": time.monotonic() - started, "run ok": run["state"] == "success"}


# ---------------------------------------------------------------------------- the measurement
def start_all(stacks: dict[str, ManyPartners]) -> None:
    """Start the stacks in parallel threads (each waits minutes for its first parse)."""
    errors: list[BaseException] = []

    def run(stack: ManyPartners) -> None:
        try:
            stack.start()
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    for stack in stacks.values():  # pgserver's start is not thread-safe: one at a time, here
        embedded_pg.start(stack.pg_label)
    threads = [threading.Thread(target=run, args=(s,)) for s in stacks.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def report(per_hour: dict[str, dict[str, float]], count: int) -> None:
    names = [*SERVICES, TRIGGERER, "postgres"]
    print("\n| settings | " + " | ".join(names) + " | all |")
    print("|---|" + "---|" * (len(names) + 1))
    for variant, figures in per_hour.items():
        cells = " | ".join(f"{figures[n]:.0f}" for n in names)
        print(f"| {variant} | {cells} | {sum(figures.values()):.0f} |")
    if {"before", "after"} <= per_hour.keys():
        before, after = per_hour["before"], per_hour["after"]
        ratios = ", ".join(f"{n} {before[n] / after[n]:.1f}x" if after[n] else f"{n} -" for n in names)
        print(f"before/after: {ratios}; all {sum(before.values()) / sum(after.values()):.2f}x")
    print(f"\nfixed idle CPU-s per partner per day (the idle hour x 24 / partners; measured at {count}):")
    for variant, figures in per_hour.items():
        for label, hour in (("all", sum(figures.values())),
                            ("without the triggerer", sum(figures.values()) - figures[TRIGGERER])):
            day = hour * 24
            shares = ", ".join(f"{n:,} partners {day / n:.2f}" for n in (count, *SCALES))
            print(f"  {variant}, {label}: {day:,.0f} CPU-s a day -> {shares}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partners", type=int, default=10)
    parser.add_argument("--shards", type=int, default=0, help="partner DAG files (shards --shards N)")
    parser.add_argument("--minutes", type=float, default=20.0, help="length of the idle measurement")
    parser.add_argument("--settle", type=float, default=120.0,
                        help="seconds after the first parses before measuring (first passes, start-up work)")
    parser.add_argument("--only", choices=("before", "after"), help="one stack instead of both")
    parser.add_argument("--profile", type=Path, help="directory for py-spy profiles of every service")
    args = parser.parse_args()
    chosen = {k: v for k, v in variants().items() if args.only in (None, k)}
    for variant, settings in chosen.items():
        print(f"{variant}: {settings}")
    services = (*SERVICES, TRIGGERER)
    seconds = args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="idle-cpu-") as tmp:
        stacks = {}
        for variant, settings in chosen.items():
            work = Path(tmp) / variant
            work.mkdir()
            stacks[variant] = ManyPartners(args.partners, args.shards, work, settings=settings, services=services,
                                           pg_label=f"bench-idle-{variant}-{int(time.time())}")
        try:
            start_all(stacks)
            time.sleep(args.settle)  # start-up work (first parses, migrations' caches) is not the idle rate
            spies = []
            if args.profile:
                args.profile.mkdir(parents=True, exist_ok=True)
                for variant, stack in stacks.items():
                    for name, proc in stack.stack.processes.items():
                        spies.append((args.profile / f"{variant}-{name}.txt",
                                      profile(proc.pid, int(seconds), args.profile / f"{variant}-{name}.txt")))
            before = {v: cpu_snapshot(s.sessions, s.postmaster) for v, s in stacks.items()}
            time.sleep(seconds)  # measuring a rate over a span of time, not waiting for a state
            used = {v: delta(cpu_snapshot(s.sessions, s.postmaster), before[v]) for v, s in stacks.items()}
            for stack in stacks.values():
                stack.stack.check_alive()
            for out, spy in spies:
                if spy is not None:
                    spy.wait(timeout=120)
                    if out.exists():
                        print(f"\n== {out.name}\n{top_frames(out)}")
            per_hour = {v: {k: c * 3600 / seconds for k, c in figures.items()} for v, figures in used.items()}
            print(f"\n{args.partners} partners, {args.minutes:g} idle minutes, the stacks in the same minutes")
            report(per_hour, args.partners)  # before the checks below, which a loaded machine can time out
            for variant, stack in stacks.items():
                if args.profile:
                    break
                try:
                    figures = reactions(stack)
                except Exception as exc:  # the idle figures above stand; say what failed
                    print(f"{variant}: check failed: {exc!r}"[:2000], flush=True)
                    continue
                print(f"{variant}: a partner added to the registry has its DAG {figures['registry change seen']:.1f} s "
                      f"after `shards --touch`; one partner's first run (6 tasks) {figures['first run']:.1f} s wall, "
                      f"{'success' if figures['run ok'] else 'FAILED'}", flush=True)
        finally:
            for stack in stacks.values():
                stack.stop()


if __name__ == "__main__":
    main()
