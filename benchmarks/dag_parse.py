"""Parse cost of the partner DAG files at many partners, the way the dag-processor parses them.

Each DAG file is parsed in a fresh process, as Airflow's dag-processor does it
(``airflow.dag_processing.processor._parse_file``: a ``BundleDagBag`` of the one file, then
``DagSerialization.to_dict`` of every DAG it built); the figure is that process's CPU
seconds (user + system, import included), not wall time: the machine is shared.

    .venv/bin/python benchmarks/dag_parse.py --partners 1000 10000
    .venv/bin/python benchmarks/dag_parse.py --partners 1000 --shards 16   # dags written by the shard command

Run it from a checkout of main too (same session) for the "before" column.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAG_FILES = ("partner_harvest.py", "partner_reconcile.py", "partner_registry_check.py")


def write_registry(path: Path, count: int) -> None:
    """``count`` OAI-PMH partners, each with its own Connection id and the documented defaults."""
    lines = ["partners:"]
    for index in range(count):
        pid = f"p{index:05d}"
        lines += [f"  - id: {pid}", "    protocol: oai-pmh", f"    conn_id: partner_{pid}",
                  "    metadata_prefix: auto", f"    description: Benchmark partner {index}."]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def child(dag_file: str, bundle: str) -> None:
    """One parse, as the dag-processor's child does it; prints JSON."""
    started = time.process_time()
    from airflow.dag_processing.dagbag import BundleDagBag
    from airflow.serialization.serialized_objects import DagSerialization

    imported = time.process_time()
    bag = BundleDagBag(dag_folder=dag_file, bundle_path=Path(bundle), bundle_name="bench", load_op_links=False)
    built = time.process_time()
    size = 0
    for dag in bag.dags.values():
        size += len(json.dumps(DagSerialization.to_dict(dag), default=str))
    done = time.process_time()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    for where, error in bag.import_errors.items():
        print(f"import error {where}: {error[-800:]}", file=sys.stderr)
    print(json.dumps({"dags": len(bag.dags), "errors": len(bag.import_errors), "airflow_import_s": imported - started,
                      "build_s": built - imported, "serialize_s": done - built, "bytes": size,
                      "cpu_s": usage.ru_utime + usage.ru_stime}))


def parse(dag_file: Path, bundle: Path, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(dag_file), str(bundle)], env=env,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"parse of {dag_file.name} failed:\n{out.stderr[-3000:]}")
    if "import error" in out.stderr:
        print(out.stderr[-1500:], file=sys.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partners", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--shards", type=int, default=0, help="write this many shard files (0: the files as shipped)")
    parser.add_argument("--sample", action="store_true",
                        help="with --shards: parse only shard 00 of each kind (the others are alike)")
    parser.add_argument("--only", default="", help="parse only the files whose name contains this")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    print(f"code: {ROOT}")
    for count in args.partners:
        with tempfile.TemporaryDirectory(prefix="dag-parse-") as tmp:
            work = Path(tmp)
            registry = work / "partners.yaml"
            write_registry(registry, count)
            dags = work / "dags"
            dags.mkdir()
            for name in DAG_FILES:
                shutil.copy(ROOT / "dags" / name, dags / name)
            env = {**{k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "HARVEST_"))},
                   "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)]),
                   "HARVEST_PARTNERS_FILE": str(registry), "AIRFLOW_HOME": str(work / "home"),
                   "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
                   "AIRFLOW__CORE__UNIT_TEST_MODE": "False", "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "0",
                   "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{work / 'airflow.db'}"}
            if args.shards:
                subprocess.run([sys.executable, "-m", "partner_harvest.cli", "shards", "--shards", str(args.shards),
                                str(dags)], env=env, check=True, capture_output=True)
            files = sorted(p for p in dags.glob("*.py") if not _ignored(dags, p) and args.only in p.name
                           and not (args.sample and "_shard_" in p.name and not p.name.endswith("_00.py")))
            total_cpu = 0.0
            worst = 0.0
            for path in files:
                result = parse(path, dags, env)
                cost = result["build_s"] + result["serialize_s"]  # the forked child has Airflow imported
                total_cpu += cost
                worst = max(worst, cost)
                if not args.shards or path.name.endswith("_00.py") or "shard" not in path.name:
                    print(f"{count:>6} partners  {path.name:<32} {result['dags']:>6} DAGs  parse {cost:6.2f} CPU-s "
                          f"(build {result['build_s']:.2f}, serialize {result['serialize_s']:.2f}; "
                          f"+ Airflow import {result['airflow_import_s']:.2f})  {result['bytes'] / 1e6:6.1f} MB")
            if args.sample:
                print(f"{count:>6} partners  (sampled: shard 00 of {args.shards} of each kind; a full pass parses "
                      f"{args.shards} of each)")
                continue
            print(f"{count:>6} partners  {len(files)} files: one full pass {total_cpu:.1f} CPU-s, "
                  f"the slowest file {worst:.2f} CPU-s")


def _ignored(dags: Path, path: Path) -> bool:
    ignore = dags / ".airflowignore"
    if not ignore.exists():
        return False
    patterns = [line.strip() for line in ignore.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return any(path.match(p) for p in patterns)


if __name__ == "__main__":
    main()
