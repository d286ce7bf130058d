"""python -m benchmarks.soak --nights 30 --seed 7: the long soak, with its table.

--scheduler: the nights run as DAG runs of a real Airflow scheduler (LocalExecutor, REST
API), which retries killed and failed tasks itself; --per-kind plans one night per fault kind.

Replay one night: the same --seed, --partners <partner> and --nights <that night>.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for _path in (str(ROOT), str(ROOT / "plugins")):
    if _path not in sys.path:
        sys.path.insert(0, _path)
os.environ.setdefault("XDG_RUNTIME_DIR", f"/tmp/ph-runtime-{os.getuid()}")
os.makedirs(os.environ["XDG_RUNTIME_DIR"], mode=0o700, exist_ok=True)


def main() -> int:
    from benchmarks.soak.driver import PARTNERS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nights", type=int, default=30)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    parser.add_argument("--partners", default=",".join(PARTNERS), help=f"comma-separated, of {', '.join(PARTNERS)}")
    parser.add_argument("--size", type=int, default=300, help="records per partner")
    parser.add_argument("--reconcile-every", type=int, default=7)
    parser.add_argument("--plan", default="", help="fix faults: partner:night=kind,... (the rest drawn from the seed)")
    parser.add_argument("--known-gaps", action="store_true",
                        help="also draw faults that diverge on today's code (clock_behind_cursor)")
    parser.add_argument("--workdir", default=None, help="night logs and results (default: a temp dir)")
    parser.add_argument("--keep-db", action="store_true",
                        help="keep the aggregation database after the soak (its conninfo is printed) to inspect a replay")
    parser.add_argument("--scheduler", action="store_true",
                        help="run the nights on a real Airflow scheduler + api-server (retries by the scheduler)")
    parser.add_argument("--only", default="",
                        help="draw faults from these kinds alone (comma-separated; 'pauses': the pause faults,"
                             " the operator commands in a retry wait included); --plan may still name any")
    parser.add_argument("--per-kind", action="store_true",
                        help="plan every fault kind once across the partners (overrides --nights; --plan still wins)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    print(f"soak seed {seed} (replay: python -m benchmarks.soak --seed {seed} --partners <p> --nights <n>)", flush=True)

    home = Path(tempfile.mkdtemp(prefix="soak-airflow-"))
    os.environ.setdefault("AIRFLOW_HOME", str(home))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(ROOT / "dags"))
    import subprocess

    if not args.scheduler:  # dag.test() nights use this home's metadata DB; the scheduler has its own
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from benchmarks.soak.driver import Soak, per_kind_plan, summary
    from benchmarks.soak.faults import FAULTS, PAUSES
    from include import embedded_pg

    label = "soak"
    server = embedded_pg.start(label)
    name = f"soak_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(server)
    params["dbname"] = name
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"night logs in {workdir}", flush=True)
    plan = {}
    for item in filter(None, args.plan.split(",")):
        where, kind = item.split("=")
        partner, night = where.split(":")
        plan[(partner, int(night))] = kind
    only = tuple(k for item in filter(None, args.only.split(",")) for k in (PAUSES if item == "pauses" else (item,)))
    unknown = [k for k in only if k not in FAULTS]
    if unknown:
        parser.error(f"--only: unknown fault kind(s) {', '.join(unknown)}")
    partners = args.partners.split(",")
    nights: int | dict[str, int] = args.nights
    if args.per_kind:
        plan = {**per_kind_plan(partners, args.known_gaps, args.scheduler), **plan}
        nights = {p: max([n for (q, n) in plan if q == p] or [1]) for p in partners}
    soak = Soak(seed=seed, nights=nights, partners=partners, conninfo=make_conninfo("", **params),
                pg_label=label, workdir=workdir, size=args.size, reconcile_every=args.reconcile_every,
                plan=plan, known_gaps=args.known_gaps, scheduler=args.scheduler, only=only,
                log=lambda line: print(line, flush=True))
    try:
        results = soak.run()
    finally:
        if args.keep_db:
            print(f"aggregation database kept: {make_conninfo('', **params)}", flush=True)
        else:
            with psycopg.connect(server, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    print(("nights on the Airflow scheduler (retries by the scheduler)\n" if args.scheduler else "") + summary(results, seed))
    return 1 if any(r.divergence for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
