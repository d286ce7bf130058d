"""Which records of an OAI-PMH repository a partner holds: its sets, minus its exclusions.

The registry's ``sets`` (or ``set``, the one-set shorthand) are harvested as their union,
one list each (a record in several comes once per list; the apply keeps one version per
identifier); no sets: the whole repository. ``exclude_sets`` take away every record whose
header names an excluded set or a set below one: OAI-PMH set hierarchies are
colon-separated paths, so ``type:dataset`` is below ``type`` and a record in it is in
``type`` too. A record listed in an allowed set is in it (some repositories do not repeat
the setSpec in the header).

OAI-PMH never signals that a record left a set: a list of the set simply stops returning
it. So an incremental window of a partner with sets also lists the whole repository's
headers of the window (ListIdentifiers, headers only): a record the aggregation holds that
is now outside the sets, or inside an excluded one, or deleted, becomes a deletion with
its reason. Such deletions are staged only for records held: a full harvest of a partner
that excludes half a repository does not remember half a repository of deletions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from partner_harvest.records import HarvestItem, Record, Tombstone
from partner_harvest.registry import Partner

EXCLUDED = "excluded_set"  # deletions.reason: the record is in an excluded set
OUTSIDE = "outside_sets"  # deletions.reason: the record is in none of the partner's sets any more


def within(spec: str, ancestor: str) -> bool:
    """Whether set ``spec`` is ``ancestor`` or below it (``a:b:c`` is within ``a`` and ``a:b``)."""
    return spec == ancestor or spec.startswith(ancestor + ":")


@dataclass(frozen=True)
class Selection:
    """The partner's sets (empty: the whole repository) and excluded sets."""

    sets: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()

    @classmethod
    def of(cls, partner: Partner) -> Selection:
        return cls(partner.selected_sets, partner.exclude_sets)

    @property
    def lists(self) -> tuple[str | None, ...]:
        """The ``set`` argument of each list a window takes: one per set, else the whole repository."""
        return self.sets or (None,)

    @property
    def sweeps_leavers(self) -> bool:
        """Whether an incremental window must list the whole repository's headers too (a record
        leaving the sets is signalled by nothing else)."""
        return bool(self.sets)

    def excluded_by(self, specs: Iterable[str]) -> str | None:
        """The excluded set a header's setSpecs fall in, or None."""
        for spec in specs:
            for excluded in self.excluded:
                if within(spec, excluded):
                    return excluded
        return None

    def within_sets(self, specs: Iterable[str]) -> bool:
        """Whether a header's setSpecs place it in one of the sets (always, without sets)."""
        return not self.sets or any(within(spec, allowed) for spec in specs for allowed in self.sets)

    def judge(self, item: HarvestItem) -> HarvestItem:
        """A listed record in an excluded set becomes a deletion; everything else stays as it is
        (a record listed by one of the sets' lists is in that set, whatever its header repeats)."""
        if self.excluded and isinstance(item, Record) and self.excluded_by(item.set_specs) is not None:
            return Tombstone(item.identifier, item.datestamp, EXCLUDED)
        return item

    def leaver(self, specs: tuple[str, ...], deleted: bool) -> tuple[bool, str | None]:
        """For a header of the whole repository's window (the leavers' sweep): whether a held
        record with it is deleted here, and the reason (None: the partner's own deletion
        notice). A header without setSpecs says nothing of its sets: not a leaver."""
        if deleted:
            return True, None
        if self.excluded_by(specs) is not None:
            return True, EXCLUDED
        if specs and not self.within_sets(specs):
            return True, OUTSIDE
        return False, None
