-- What a harvest run's tasks said when they did not harvest: a failed try waiting for the next
-- ('retry'), a last try that failed ('failed', with the error the alert carries), a run that
-- skipped ('skipped': a first scheduled run without a cursor; 'empty': a window after the
-- partner's clock). A run that fails before it writes harvest_runs (an unreachable endpoint)
-- is otherwise only in Airflow's logs; the health page and `partner-harvest status` read it here.
CREATE TABLE IF NOT EXISTS run_events (
    id          bigserial   PRIMARY KEY,
    partner_id  text        NOT NULL,
    dag_id      text        NOT NULL,
    run_id      text        NOT NULL,  -- <dag_id>/<Airflow run id>, as harvest_runs.run_id
    task_id     text        NOT NULL,
    try_number  integer,
    kind        text        NOT NULL CHECK (kind IN ('retry', 'failed', 'skipped', 'empty')),
    message     text        NOT NULL,
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS run_events_partner_at ON run_events (partner_id, dag_id, at DESC);
