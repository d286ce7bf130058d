"""Metadata payloads (oai_dc and LIDO) for simulated records.

Descriptive values come from small vocabularies picked by a hash of the record
number, escaped once at import time, so each payload is a single f-string.
Some values carry non-ASCII characters, `&` and `<` so that clients have to get
encoding and escaping right.
"""

from __future__ import annotations

from collections.abc import Callable

from .collection import Record

OAI_DC_NS = "http://www.openarchives.org/OAI/2.0/oai_dc/"
DC_NS = "http://purl.org/dc/elements/1.1/"
LIDO_NS = "http://www.lido-schema.org"
XSI_NS = "http://www.w3.org/2001/XMLSchema-instance"
FORMAT_INFO: dict[str, tuple[str, str]] = {  # prefix -> (schema, namespace)
    "oai_dc": ("http://www.openarchives.org/OAI/2.0/oai_dc.xsd", OAI_DC_NS),
    "lido": ("http://www.lido-schema.org/schema/v1.0/lido-v1.0.xsd", LIDO_NS),
}
MUSEUM = "Simulated Museum of Art"
OBJECT_URL = "https://collection.sim.example/objects/"

SUBJECTS: tuple[str, ...] = (
    "Landscape with a river",
    "Portrait of a woman",
    "Still life with fruit & flowers",
    "Café interior at night",
    "Street in Köln",
    "Mount Fuji seen from Kōshū (富士山)",
    "Ships & sea, evening",
    "Study <after Rembrandt>",
    "Łódź factory yard",
    "Harbour view",
    "Madonna and child",
    "Dancers at the Opéra",
)
CREATORS: tuple[str, ...] = (
    "Dürer, Albrecht",
    "Katsushika Hokusai (葛飾北斎)",
    "Rembrandt van Rijn",
    "Morisot, Berthe",
    "Anonymous",
    "Brâncuși, Constantin",
    "Smith & Sons (workshop)",
    "Kollwitz, Käthe",
)
TYPE_AAT = {"painting": "300033618", "print": "300041273", "sculpture": "300047090"}


def escape(text: str) -> str:
    """Escape text for element content and double-quoted attributes."""
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


_SUBJECTS_XML = tuple(escape(s) for s in SUBJECTS)
_CREATORS_XML = tuple(escape(c) for c in CREATORS)


def _mix(number: int) -> int:
    h = (number * 0x9E3779B1) & 0xFFFFFFFF
    return h ^ (h >> 16)


def subject(number: int) -> str:
    return SUBJECTS[_mix(number) % len(SUBJECTS)]


def creator(number: int) -> str:
    return CREATORS[(_mix(number) >> 5) % len(CREATORS)]


def year(number: int) -> int:
    return 1450 + (_mix(number) >> 9) % 560


def title(record: Record) -> str:
    """The unescaped title a client should end up with ("" when deliberately invalid)."""
    if record.invalid:
        return ""
    return f"Object {record.content_number}, version {record.version}: {subject(record.content_number)}"


def _title_xml(record: Record, subject_xml: str) -> str:
    if record.invalid:
        return ""
    return f"Object {record.content_number}, version {record.version}: {subject_xml}"


def oai_dc(record: Record) -> str:
    """Simple Dublin Core payload, as every OAI-PMH repository must offer."""
    n = record.content_number
    h = _mix(n)
    subject_xml = _SUBJECTS_XML[h % len(SUBJECTS)]
    return (
        f'<oai_dc:dc xmlns:oai_dc="{OAI_DC_NS}" xmlns:dc="{DC_NS}" xmlns:xsi="{XSI_NS}" '
        f'xsi:schemaLocation="{OAI_DC_NS} http://www.openarchives.org/OAI/2.0/oai_dc.xsd">'
        f"<dc:title>{_title_xml(record, subject_xml)}</dc:title>"
        f"<dc:creator>{_CREATORS_XML[(h >> 5) % len(CREATORS)]}</dc:creator>"
        f"<dc:date>{1450 + (h >> 9) % 560}</dc:date>"
        f"<dc:type>{record.object_type}</dc:type>"
        f"<dc:identifier>{OBJECT_URL}{n}</dc:identifier>"
        f"<dc:subject>{subject_xml}</dc:subject>"
        f"</oai_dc:dc>"
    )


def lido(record: Record) -> str:
    """A small LIDO 1.0 record with the elements museum aggregators map first."""
    n = record.content_number
    h = _mix(n)
    subject_xml = _SUBJECTS_XML[h % len(SUBJECTS)]
    kind = record.object_type
    return (
        f'<lido:lido xmlns:lido="{LIDO_NS}" xmlns:xsi="{XSI_NS}" '
        f'xsi:schemaLocation="{LIDO_NS} http://www.lido-schema.org/schema/v1.0/lido-v1.0.xsd">'
        f'<lido:lidoRecID lido:type="local">sim.example/rec-{n:07d}</lido:lidoRecID>'
        f"<lido:category>"
        f'<lido:conceptID lido:type="URI">http://www.cidoc-crm.org/crm-concepts/E22</lido:conceptID>'
        f'<lido:term xml:lang="en">Man-Made Object</lido:term>'
        f"</lido:category>"
        f'<lido:descriptiveMetadata xml:lang="en">'
        f"<lido:objectClassificationWrap><lido:objectWorkTypeWrap><lido:objectWorkType>"
        f'<lido:conceptID lido:type="URI">http://vocab.getty.edu/aat/{TYPE_AAT[kind]}</lido:conceptID>'
        f"<lido:term>{kind}</lido:term>"
        f"</lido:objectWorkType></lido:objectWorkTypeWrap></lido:objectClassificationWrap>"
        f"<lido:objectIdentificationWrap><lido:titleWrap><lido:titleSet>"
        f'<lido:appellationValue lido:pref="preferred">{_title_xml(record, subject_xml)}</lido:appellationValue>'
        f"</lido:titleSet></lido:titleWrap></lido:objectIdentificationWrap>"
        f"<lido:eventWrap><lido:eventSet><lido:event>"
        f"<lido:eventType><lido:term>Production</lido:term></lido:eventType>"
        f"<lido:eventActor><lido:actorInRole><lido:actor><lido:nameActorSet>"
        f"<lido:appellationValue>{_CREATORS_XML[(h >> 5) % len(CREATORS)]}</lido:appellationValue>"
        f"</lido:nameActorSet></lido:actor></lido:actorInRole></lido:eventActor>"
        f"<lido:eventDate><lido:displayDate>{1450 + (h >> 9) % 560}</lido:displayDate></lido:eventDate>"
        f"</lido:event></lido:eventSet></lido:eventWrap>"
        f"</lido:descriptiveMetadata>"
        f'<lido:administrativeMetadata xml:lang="en"><lido:recordWrap>'
        f'<lido:recordID lido:type="local">rec-{n:07d}</lido:recordID>'
        f"<lido:recordType><lido:term>item</lido:term></lido:recordType>"
        f"<lido:recordSource><lido:legalBodyName><lido:appellationValue>{MUSEUM}</lido:appellationValue>"
        f"</lido:legalBodyName></lido:recordSource>"
        f"<lido:recordInfoSet><lido:recordInfoLink>{OBJECT_URL}{n}</lido:recordInfoLink></lido:recordInfoSet>"
        f"</lido:recordWrap></lido:administrativeMetadata>"
        f"</lido:lido>"
    )


RENDERERS: dict[str, Callable[[Record], str]] = {"oai_dc": oai_dc, "lido": lido}


def render(prefix: str, record: Record) -> str:
    """Payload for `prefix`; KeyError for a format we cannot produce."""
    return RENDERERS[prefix](record)
