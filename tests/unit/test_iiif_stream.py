"""The stream reader against the IIIF Change Discovery 1.0 specification's own examples
(tests/fixtures/iiif, SOURCE.md): nothing stricter than the specification."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from partner_harvest.formats.linked_art import LINKED_ART, NotAJsonRecord, load
from partner_harvest.iiif.spec import DEFAULT_SEE_ALSO, SeeAlsoChoice
from partner_harvest.iiif.stream import StreamError, choose, parse_collection, parse_page, parse_time

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "iiif"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def test_spec_collection() -> None:
    collection = parse_collection(fixture("spec-collection.json"), "https://example.org/x")
    assert collection.last == "https://example.org/activity/page-214"
    assert collection.total_items == 21456


def test_collection_needs_only_last() -> None:
    collection = parse_collection({"type": "OrderedCollection", "last": "https://e.org/p9"}, "https://e.org/c")
    assert collection.last == "https://e.org/p9" and collection.total_items is None and collection.first is None
    with pytest.raises(StreamError, match="last"):
        parse_collection({"type": "OrderedCollection", "first": {"id": "https://e.org/p0"}}, "https://e.org/c")


def test_spec_page() -> None:
    page = parse_page(fixture("spec-page.json"), "https://example.org/activity/page-1")
    assert page.prev == "https://example.org/activity/page-0" and page.start_index == 20
    assert [a.object_id for a in page.items] == ["https://example.org/iiif/9/manifest",
                                                  "https://example.org/iiif/2/manifest"]
    assert page.items[1].when == datetime(2018, 3, 11, 16, 30, tzinfo=timezone.utc)


def test_spec_negotiable_bare_see_also_takes_the_objects_format() -> None:
    page = parse_page(fixture("spec-negotiable.json"), "https://e.org/p")
    offer = page.items[0].see_also[0]
    assert offer.url == "https://example.org/iiif/1/metadata.xml" and (offer.format or "").startswith("application/ld+json")
    assert choose(page.items[0].see_also, (SeeAlsoChoice(prefix="linked_art", format="application/ld+json"),))


def test_spec_activities_add_remove_refresh_canonical_move() -> None:
    page = parse_page(fixture("spec-activities.json"), "https://e.org/p")
    kinds = [a.kind for a in page.items]
    assert kinds == ["Remove", "Add", "Refresh", "Update", "Move"]
    assert page.items[0].origin_id == "https://example.org/activity/aggregated-changes"
    assert page.items[2].object_id is None and page.items[2].when == datetime(2020, 6, 21, tzinfo=timezone.utc)
    assert page.items[4].target_id == "http://example.org/a/manifest"
    assert page.items[4].target_see_also[0].url == "https://example.org/single-item-a.jsonld"
    # schema.org is not in the default preference list: no description is chosen for it
    assert choose(page.items[3].see_also, DEFAULT_SEE_ALSO[:2]) is None


def test_end_time_is_only_a_should_and_unknown_entries_are_counted() -> None:
    page = parse_page({"orderedItems": [{"type": "Update", "object": {"id": "https://e.org/1", "type": "X"}},
                                        {"object": {"id": "https://e.org/2"}}, "junk"]}, "https://e.org/p")
    assert len(page.items) == 1 and page.items[0].when is None and page.unusable == 2


@pytest.mark.parametrize("text, expected", [
    ("2026-01-05T08:00:01Z", datetime(2026, 1, 5, 8, 0, 1, tzinfo=timezone.utc)),
    ("2026-01-05T08:00:01.123456789Z", datetime(2026, 1, 5, 8, 0, 1, 123456, tzinfo=timezone.utc)),
    ("2026-01-05T10:00:01+02:00", datetime(2026, 1, 5, 8, 0, 1, tzinfo=timezone.utc)),
    ("2026-01-05T03:30:01-0430", datetime(2026, 1, 5, 8, 0, 1, tzinfo=timezone.utc)),
    ("2026-01-05T08:00:01", datetime(2026, 1, 5, 8, 0, 1, tzinfo=timezone.utc)),
    ("yesterday", None),
])
def test_times(text: str, expected: datetime | None) -> None:
    assert parse_time(text) == expected


def test_linked_art_title_and_checks() -> None:
    doc = load(b'{"@context": "https://linked.art/ns/v1/linked-art.json", "_label": "x", "identified_by": ['
               b'{"type": "Name", "content": "Second"}, {"type": "Name", "content": " Primary  name ",'
               b' "classified_as": [{"id": "http://vocab.getty.edu/aat/300404670"}]}]}')
    checked = LINKED_ART.check_document(doc)
    assert checked.title == "Primary name" and not checked.findings
    bare = LINKED_ART.check_document({"id": "x"})
    assert {f.check for f in bare.findings} == {"linked_art.no_context", "linked_art.no_title"}
    for body in (b"[1]", b"{", b"[" * 100 + b"]" * 100):
        with pytest.raises(NotAJsonRecord):
            load(body)
    deep: object = 1
    for _ in range(70):
        deep = [deep]
    with pytest.raises(NotAJsonRecord, match="deeper"):
        load(json.dumps({"a": deep}).encode())


# -- real streams (tests/fixtures/iiif/SOURCE.md) ------------------------------------------

def test_getty_collection_uses_the_as2_context_and_its_total_is_only_a_witness() -> None:
    collection = parse_collection(fixture("getty-collection.json"), "https://data.getty.edu/x")
    assert collection.last == "https://data.getty.edu/museum/collection/activity-stream/page/8"
    assert collection.first == "https://data.getty.edu/museum/collection/activity-stream/page/1"
    assert collection.total_items == 232916  # far more than 8 pages of 100 hold: a witness, never a rule


def test_getty_page_without_end_time_reads_created_as_the_activitys_time() -> None:
    """Regression (real data): the Getty's page carries `created` (no zone) and no endTime.
    Before, every activity's time was None, so an incremental night could never stop early
    and would walk the whole stream back to its first page."""
    page = parse_page(fixture("getty-page.json"), "https://data.getty.edu/museum/collection/activity-stream/page/1")
    assert page.prev is None and page.unusable == 0  # the first page; partOf and next are not needed
    assert [a.kind for a in page.items] == ["Create"] * 5
    assert [a.object_type for a in page.items] == ["Group", "Person", "HumanMadeObject", "LinguisticObject",
                                                   "PropositionalObject"]
    assert page.items[0].when == datetime(2020, 5, 11, 21, 56, 48, tzinfo=timezone.utc)
    assert all(a.when is not None for a in page.items)
    assert page.items[2].see_also == ()  # the record is the object id itself (no seeAlso)


def test_oclc_contentdm_collection_with_a_presentation_context_list() -> None:
    body = fixture("oclc-contentdm-collection.json")
    assert isinstance(body["@context"], list) and "discovery" not in json.dumps(body["@context"])
    collection = parse_collection(body, "http://52.204.112.237:3051/activity-streams/15878/")
    assert collection.last == "http://52.204.112.237:3051/activity-streams/15878/13"
    assert collection.total_items == 61670
