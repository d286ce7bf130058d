"""A partner's state: one table for ``partner-harvest status`` and the health page.

Both call :func:`decide` with the same facts (``store.health.partner_health`` gathers them),
so the terminal and the browser can never disagree. The README's list of states is
generated from :data:`TABLE` (``python -m partner_harvest.partner_state``; a test fails
when the README's copy is stale).

The states are listed worst first: the first whose condition holds is the partner's state.
"""

from __future__ import annotations

from dataclasses import dataclass

# What the newest harvest run of a partner is doing (store.health.NewestRun.status).
RUN_FAILED, RUN_RETRYING, RUN_RUNNING, RUN_APPLIED, RUN_SKIPPED = "failed", "retrying", "running", "applied", "skipped"


@dataclass(frozen=True)
class State:
    name: str
    condition: str  # when a partner is in this state (the README's column)
    action: str  # what the operator does about it


TABLE: tuple[State, ...] = (
    State("invalid", "the partner's registry entry is invalid: it has an error DAG and nothing is harvested",
          "fix the entry (`partner-harvest validate` names the field)"),
    State("failing", "the newest harvest run failed: a task failed its last try (or the run was abandoned); "
          "the cause is the task's error, as in the alert",
          "read the cause; clear the task once the partner is back"),
    State("retrying", "the newest run is between tries: a task failed a try and waits for the next "
          "(Airflow `up_for_retry`), or waits for the time the partner named or for another run's lease "
          "(`up_for_reschedule`); the cause is the last try's error",
          "nothing yet; it becomes `failing` when the tries run out"),
    State("running", "a harvest run is going on now", "`partner-harvest progress ID` shows how far it is"),
    State("behind", "the cursor trails the partner's clock (as the newest run saw it, moved on by the time "
          "since) by more than one schedule interval + the run deadline + the partner's lag",
          "look for runs that did not happen (paused DAG, missing pool)"),
    State("quiet", "the newest run applied, but nothing was fetched for longer than the partner's `quiet_period`",
          "ask the partner whether its repository still changes"),
    State("warning", "the newest successful run left another open data-quality alert (quarantine rate, purge "
          "spike, list size, completeness check)", "read the alert"),
    State("never run", "no harvest run applied yet (a skipped first scheduled run says why: trigger the first "
          "full harvest by hand)", "trigger `harvest_<id>` once by hand"),
    State("ok", "the newest run applied, the cursor keeps up with the partner's clock, no open alert", "nothing"),
)
NAMES: tuple[str, ...] = tuple(state.name for state in TABLE)
INVALID, FAILING, RETRYING, RUNNING, BEHIND, QUIET, WARNING, NEVER_RUN, OK = NAMES


def decide(*, invalid: bool, newest_run: str | None, ever_applied: bool, behind: bool, quiet: bool,
           alerts: bool) -> str:
    """The partner's state from its facts, by the table's order (worst first).

    ``newest_run`` is what the partner's newest harvest run is doing (``RUN_*``, None when
    it never ran); ``ever_applied`` whether any harvest run applied.
    """
    if invalid:
        return INVALID
    if newest_run == RUN_FAILED:
        return FAILING
    if newest_run == RUN_RETRYING:
        return RETRYING
    if newest_run == RUN_RUNNING:
        return RUNNING
    if not ever_applied:
        return NEVER_RUN
    if behind:
        return BEHIND
    if quiet:
        return QUIET
    if alerts:
        return WARNING
    return OK


def slug(name: str) -> str:
    """The state as a CSS class / attribute value (``never run`` -> ``never-run``)."""
    return name.replace(" ", "-")


def markdown_table() -> str:
    """The README's table of states (generated: keep the README's copy in step)."""
    rows = ["| state | when | what to do |", "|---|---|---|"]
    rows += [f"| `{s.name}` | {s.condition} | {s.action} |" for s in TABLE]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
