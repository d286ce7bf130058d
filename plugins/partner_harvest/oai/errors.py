"""What an OAI-PMH response can say instead of data.

``OaiProtocolError`` is the repository speaking (an ``<error code=...>`` element), one
subclass per code the harvest reacts to differently (an expired token restarts the
window, noRecordsMatch is an empty window). ``OaiResponseError`` is a document that is
XML but not an OAI-PMH response at all. Both render as one line naming the cause.
"""

from __future__ import annotations

__all__ = [
    "BadArgument",
    "BadResumptionToken",
    "BadVerb",
    "CannotDisseminateFormat",
    "IdDoesNotExist",
    "NoMetadataFormats",
    "NoRecordsMatch",
    "NoSetHierarchy",
    "OaiError",
    "OaiProtocolError",
    "OaiResponseError",
    "protocol_error",
]


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


class OaiError(Exception):
    """Base of everything the OAI-PMH layer refuses; catch this for 'unusable answer'."""


class OaiResponseError(OaiError):
    """XML that is not an OAI-PMH response (wrong root, bogus wrapper, no verb element)."""

    def __init__(self, message: str):
        self.message = _one_line(message)
        super().__init__(self.message)


class OaiProtocolError(OaiError):
    """An ``<error>`` element; ``code`` may be non-standard or missing (None).

    ``errors`` keeps every (code, message) pair when a response carried several.
    """

    CODE: str | None = None

    def __init__(
        self,
        code: str | None,
        message: str = "",
        errors: tuple[tuple[str | None, str], ...] = (),
    ):
        self.code = _one_line(code) or None
        self.message = _one_line(message)
        self.errors = errors or ((self.code, self.message),)
        super().__init__(self.code, self.message)

    def __str__(self) -> str:
        text = f"{self.code or '(no error code)'}: {self.message or '(no message)'}"
        others = [c or "(no error code)" for c, _ in self.errors[1:]]
        if others:
            text += f" (also: {', '.join(others)})"
        return text


class BadArgument(OaiProtocolError):
    CODE = "badArgument"


class BadResumptionToken(OaiProtocolError):
    """The token expired or is unknown: only a restart of the window helps (tokens cannot be resumed once their session died)."""

    CODE = "badResumptionToken"


class BadVerb(OaiProtocolError):
    CODE = "badVerb"


class CannotDisseminateFormat(OaiProtocolError):
    CODE = "cannotDisseminateFormat"


class IdDoesNotExist(OaiProtocolError):
    CODE = "idDoesNotExist"


class NoMetadataFormats(OaiProtocolError):
    CODE = "noMetadataFormats"


class NoRecordsMatch(OaiProtocolError):
    """An empty selection; list parsers turn it into an empty page instead of raising."""

    CODE = "noRecordsMatch"


class NoSetHierarchy(OaiProtocolError):
    CODE = "noSetHierarchy"


_BY_CODE: dict[str, type[OaiProtocolError]] = {
    cls.CODE: cls
    for cls in (
        BadArgument,
        BadResumptionToken,
        BadVerb,
        CannotDisseminateFormat,
        IdDoesNotExist,
        NoMetadataFormats,
        NoRecordsMatch,
        NoSetHierarchy,
    )
    if cls.CODE
}


def protocol_error(
    code: str | None, message: str = "", errors: tuple[tuple[str | None, str], ...] = ()
) -> OaiProtocolError:
    """The exception for an OAI error code; unknown codes get the base class."""
    cls = _BY_CODE.get(_one_line(code), OaiProtocolError)
    return cls(code, message, errors)
