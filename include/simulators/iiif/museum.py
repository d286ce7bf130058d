"""A simulated museum whose changes are published as an IIIF Change Discovery stream.

What the specification lets a publisher vary, the museum varies (I13): page sizes (one size,
or a cycle of sizes), several activities with one endTime (also across a page boundary),
several activities per object, Move, Add/Remove, a Refresh that rebuilds the stream and
truncates its history, a missing or wrong ``totalItems``, endTimes with fractions or with
offsets, seeAlso as objects, a list or a bare URL, descriptions that 404 or are invalid.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

CONTEXT = "http://iiif.io/api/discovery/1/context.json"
LINKED_ART_CONTEXT = "https://linked.art/ns/v1/linked-art.json"
LINKED_ART_PROFILE = "https://linked.art/ns/v1/linked-art.json"
START = datetime(2026, 1, 5, 8, 0, 0, tzinfo=timezone.utc)


@dataclass
class Event:
    kind: str
    slug: str | None  # the object's slug (None: Refresh)
    when: datetime
    target: str | None = None  # Move: the new slug


@dataclass
class Museum:
    page_sizes: tuple[int, ...] = (100,)
    total_items: str = "right"  # right | missing | wrong
    fractions: bool = False  # endTimes with microseconds
    offsets: bool = False  # endTimes written with a +02:00 offset
    tick: timedelta = timedelta(seconds=1)
    see_also_style: str = "list"  # list | object | bare | none (the object's id is its Linked Art, as the Getty's)
    stamp: str = "endTime"  # the activity's time property: endTime, or created (the Getty's stream of 2020)
    lido_too: bool = False  # offer a LIDO seeAlso besides Linked Art
    live: dict[str, int] = field(default_factory=dict)  # slug -> version
    events: list[Event] = field(default_factory=list)
    missing: set[str] = field(default_factory=set)  # descriptions answering 404
    invalid: set[str] = field(default_factory=set)  # descriptions that are not Linked Art JSON
    invalid_every: int = 0  # also every object whose number is a multiple of this (0: none)
    gone: set[str] = field(default_factory=set)  # slugs deleted or moved away (some re-created since)
    now: datetime = START
    _counter: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)

    # -- changes ---------------------------------------------------------------------

    def _advance(self, same_time: bool) -> datetime:
        if not same_time:
            self.now += self.tick
            if self.fractions:
                self.now += timedelta(microseconds=(self._counter * 7919) % 1_000_000 or 1)
        return self.now

    def create(self, count: int = 1, *, same_time: bool = False) -> list[str]:
        made: list[str] = []
        with self.lock:
            for _ in range(count):
                self._counter += 1
                slug = f"o{self._counter}"
                self.live[slug] = 1
                self.events.append(Event("Create", slug, self._advance(same_time and bool(made))))
                made.append(slug)
        return made

    @property
    def clock(self) -> datetime:
        """The museum's now: the next activity is stamped after it."""
        return self.now

    def advance_clock(self, by: timedelta) -> datetime:
        with self.lock:
            self.now += by
            return self.now

    def is_invalid(self, slug: str) -> bool:
        return slug in self.invalid or bool(self.invalid_every and int(slug[1:]) % self.invalid_every == 0)

    @staticmethod
    def title(slug: str, version: int) -> str:
        """The Linked Art primary name of an object's version (what the mirror's title holds)."""
        return f"Object {slug}, version {version}"

    def update(self, slug: str, *, same_time: bool = False) -> None:
        with self.lock:
            self.live[slug] += 1
            self.events.append(Event("Update", slug, self._advance(same_time)))

    def delete(self, slug: str, *, same_time: bool = False) -> None:
        with self.lock:
            del self.live[slug]
            self.gone.add(slug)
            self.events.append(Event("Delete", slug, self._advance(same_time)))

    def recreate(self, slug: str, *, same_time: bool = False) -> None:
        with self.lock:
            self.live[slug] = self.live.get(slug, 0) + 1
            self.events.append(Event("Create", slug, self._advance(same_time)))

    def move(self, slug: str) -> str:
        with self.lock:
            self._counter += 1
            target = f"o{self._counter}"
            self.live[target] = self.live.pop(slug)
            self.gone.add(slug)
            self.events.append(Event("Move", slug, self._advance(False), target))
            return target

    def refresh(self, *, truncate: bool = True) -> None:
        """Rebuild the stream: a Refresh, then an Update for every live object. Truncated: the
        history before it is gone (its Deletes too)."""
        with self.lock:
            when = self._advance(False)
            kept = [] if truncate else list(self.events)
            kept.append(Event("Refresh", None, when))
            for slug in sorted(self.live, key=lambda s: int(s[1:])):
                kept.append(Event("Update", slug, self._advance(False)))
            self.events = kept

    def mutate(self, edit: int = 0, delete: int = 0, add: int = 0, move: int = 0) -> dict[str, list[str]]:
        """A night's changes, spread over the live set (every k-th object): slugs per kind."""
        with self.lock:
            live = sorted(self.live, key=lambda s: int(s[1:]))
            step = max(1, len(live) // max(1, edit + delete + move))
            picked = live[::step]
            edited, deleted, moved = picked[:edit], picked[edit:edit + delete], picked[edit + delete:edit + delete + move]
            for slug in edited:
                self.update(slug)
            for slug in deleted:
                self.delete(slug)
            targets = [self.move(slug) for slug in moved]
            return {"edited": edited, "deleted": deleted, "moved": moved, "targets": targets,
                    "added": self.create(add)}

    # -- rendering -------------------------------------------------------------------

    def pages(self) -> list[list[Event]]:
        with self.lock:
            events = list(self.events)
        pages: list[list[Event]] = []
        index = 0
        while index < len(events) or not pages:
            size = self.page_sizes[len(pages) % len(self.page_sizes)]
            pages.append(events[index:index + size])
            index += size
        return pages

    def time_text(self, when: datetime) -> str:
        if self.offsets:
            local = when.astimezone(timezone(timedelta(hours=2)))
            return local.isoformat(timespec="microseconds" if self.fractions else "seconds")
        if self.fractions:
            return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return when.strftime("%Y-%m-%dT%H:%M:%SZ")

    def collection(self, base: str) -> dict[str, Any]:
        pages = self.pages()
        body: dict[str, Any] = {
            "@context": CONTEXT, "id": f"{base}/stream/collection.json", "type": "OrderedCollection",
            "first": {"id": f"{base}/stream/page-0.json", "type": "OrderedCollectionPage"},
            "last": {"id": f"{base}/stream/page-{len(pages) - 1}.json", "type": "OrderedCollectionPage"},
        }
        total = sum(len(p) for p in pages)
        if self.total_items == "right":
            body["totalItems"] = total
        elif self.total_items == "wrong":
            body["totalItems"] = total + 3
        return body

    def page(self, base: str, number: int) -> dict[str, Any] | None:
        pages = self.pages()
        if not 0 <= number < len(pages):
            return None
        body: dict[str, Any] = {
            "@context": CONTEXT, "id": f"{base}/stream/page-{number}.json", "type": "OrderedCollectionPage",
            "partOf": {"id": f"{base}/stream/collection.json", "type": "OrderedCollection"},
            "startIndex": sum(len(p) for p in pages[:number]),
            "orderedItems": [self.activity(base, e) for e in pages[number]],
        }
        if number > 0:
            body["prev"] = {"id": f"{base}/stream/page-{number - 1}.json", "type": "OrderedCollectionPage"}
        if number < len(pages) - 1:
            body["next"] = {"id": f"{base}/stream/page-{number + 1}.json", "type": "OrderedCollectionPage"}
        return body

    def object_ref(self, base: str, slug: str) -> dict[str, Any]:
        offers: list[dict[str, Any]] = [{"id": f"{base}/objects/{slug}/linked-art.json", "type": "Dataset",
                                         "format": "application/ld+json", "profile": LINKED_ART_PROFILE}]
        if self.lido_too:
            offers.insert(0, {"id": f"{base}/objects/{slug}/lido.xml", "type": "Dataset",
                              "format": "application/xml", "profile": "http://www.lido-schema.org"})
        ref: dict[str, Any] = {"id": f"{base}/objects/{slug}", "type": "HumanMadeObject"}
        if self.see_also_style == "object":
            ref["seeAlso"] = offers[0]
        elif self.see_also_style == "none":
            pass
        elif self.see_also_style == "bare":
            ref["seeAlso"] = offers[-1]["id"]
            ref["format"] = "application/ld+json"
        else:
            ref["seeAlso"] = offers
        return ref

    def activity(self, base: str, event: Event) -> dict[str, Any]:
        if event.kind == "Refresh":
            return {"type": "Refresh", "summary": "stream rebuilt", "startTime": self.time_text(event.when)}
        assert event.slug is not None
        body: dict[str, Any] = {"type": event.kind, "object": self.object_ref(base, event.slug),
                                self.stamp: self.time_text(event.when)}
        if event.kind == "Delete":
            body["object"] = {"id": f"{base}/objects/{event.slug}", "type": "HumanMadeObject"}
        if event.target is not None:
            body["target"] = self.object_ref(base, event.target)
        return body

    def linked_art(self, base: str, slug: str) -> bytes | None:
        with self.lock:
            version = self.live.get(slug)
        if version is None or slug in self.missing:
            return None
        if self.is_invalid(slug):
            return b'{"@context": "' + LINKED_ART_CONTEXT.encode() + b'", "id": truncated'
        return json.dumps({
            "@context": LINKED_ART_CONTEXT, "id": f"{base}/objects/{slug}", "type": "HumanMadeObject",
            "_label": f"Object {slug}",
            "identified_by": [{"type": "Name", "content": self.title(slug, version),
                               "classified_as": [{"id": "http://vocab.getty.edu/aat/300404670", "type": "Type",
                                                  "_label": "Primary Name"}]}],
        }).encode()

    def lido(self, slug: str) -> bytes | None:
        with self.lock:
            version = self.live.get(slug)
        if version is None or slug in self.missing:
            return None
        return (f'<lido:lido xmlns:lido="http://www.lido-schema.org"><lido:lidoRecID lido:type="local">{slug}'
                f'</lido:lidoRecID><lido:descriptiveMetadata xml:lang="en"><lido:objectClassificationWrap>'
                f'<lido:objectWorkTypeWrap><lido:objectWorkType><lido:term>painting</lido:term></lido:objectWorkType>'
                f'</lido:objectWorkTypeWrap></lido:objectClassificationWrap><lido:objectIdentificationWrap>'
                f'<lido:titleWrap><lido:titleSet><lido:appellationValue>Object {slug}, version {version}'
                f'</lido:appellationValue></lido:titleSet></lido:titleWrap></lido:objectIdentificationWrap>'
                f'</lido:descriptiveMetadata></lido:lido>').encode()

    def write_static(self, root: Path, base: str) -> None:
        """The stream and the descriptions as plain files under ``root`` (served by any static server)."""
        (root / "stream").mkdir(parents=True, exist_ok=True)
        (root / "stream" / "collection.json").write_text(json.dumps(self.collection(base)))
        for number in range(len(self.pages())):
            (root / "stream" / f"page-{number}.json").write_text(json.dumps(self.page(base, number)))
        for slug in list(self.live):
            body = self.linked_art(base, slug)
            if body is not None:
                (root / "objects" / slug).mkdir(parents=True, exist_ok=True)
                (root / "objects" / slug / "linked-art.json").write_bytes(body)

    def identifier(self, base: str, slug: str) -> str:
        return f"{base}/objects/{slug}"
