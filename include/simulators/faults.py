"""A simulator's adversary, declared once: every fault it can play is a field of one object.

Each simulator declares a `Faults` subclass (``oai_pmh/faults.py``, ``sierra/faults.py``):
one field per switch, its docstring the switch's help. Everything else reads that
declaration: the command line (``--field-name`` for every field whose value fits on one,
``--faults JSON`` for any), ``POST /_control/faults`` with a JSON object of fields (answered,
like ``GET /_control/faults``, with all of them), ``sim.set_faults(field=value)`` in Python,
and the request handlers, which read ``sim.faults`` where the fault takes effect and spend
one-shot faults with ``take_fault``. A new adversary is one field and its effect.

The object is frozen and replaced whole under the simulator's lock, so a handler reads one
consistent set of switches without taking the lock. What servers do to connections (idle
keep-alive closing, resets) is not here: ``loopback.py`` does it for every simulator.
"""

from __future__ import annotations

import argparse
import json
import types
from typing import Any, Literal, Self, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Frozen(BaseModel):
    """The fault models' base: frozen, no unknown fields, field docstrings as their help."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class Shot(Frozen):
    """A fault for the next `count` requests it applies to; spent one request at a time.

    A count of 0 is no fault at all (the field reads None), as ``fail_next(0)`` disarms."""

    count: int = Field(1, ge=0)
    """How many requests get it."""

    def spent(self) -> Self | None:
        """What is left once one request has had it."""
        return self.model_copy(update={"count": self.count - 1}) if self.count > 1 else None


class Faults(Frozen):
    """No faults: a simulator's own subclass adds one field per switch.

    One-shot fields are spent by `spend`: a `Shot` loses one from its count, anything else
    returns to its default."""

    @field_validator("*", mode="after")
    @classmethod
    def _no_count_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, Shot) and value.count == 0 else value

    def changed(self, **changes: Any) -> Self:
        """A copy with `changes`, validated: a bad value raises ValueError (400 over HTTP)."""
        return self.model_validate({**dict(self), **changes})

    def spend(self, name: str) -> Self:
        """A copy in which the one-shot fault `name` has served one request."""
        value = getattr(self, name)
        left = value.spent() if isinstance(value, Shot) else type(self).model_fields[name].default
        return self.model_copy(update={name: left})

    def report(self) -> dict[str, Any]:
        """Every switch as JSON (what ``GET /_control/faults`` answers)."""
        return self.model_dump(mode="json")


# ------------------------------------------------------------------ command line
AnyFaults = TypeVar("AnyFaults", bound=Faults)


def add_fault_arguments(parser: argparse.ArgumentParser, faults: type[Faults]) -> None:
    """``--field-name`` for every field of `faults` that is a bool, number, string or
    choice (optional or not), ``--faults JSON`` for any field; help from the docstrings."""
    group = parser.add_argument_group("faults", f"the adversary's switches ({faults.__name__}); "
                                                "also POST /_control/faults")
    group.add_argument("--faults", default="{}", metavar="JSON", help="any faults, as a JSON object of fields")
    for name, field in faults.model_fields.items():
        kind = _plain(field.annotation)
        if kind is None:
            continue
        options: dict[str, Any] = {"dest": f"faults.{name}", "default": argparse.SUPPRESS,
                                   "help": (field.description or "").replace("%", "%%")}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif isinstance(kind, tuple):
            options["choices"] = kind
            options["type"] = type(kind[0])
        else:
            options["type"] = kind
            options["metavar"] = kind.__name__.upper()
        group.add_argument("--" + name.replace("_", "-"), **options)


def faults_from_arguments(args: argparse.Namespace, faults: type[AnyFaults]) -> AnyFaults:
    """The faults the command line set (`add_fault_arguments`), on top of the defaults."""
    given = {key.removeprefix("faults."): value for key, value in vars(args).items() if key.startswith("faults.")}
    return faults.model_validate({**json.loads(args.faults), **given})


def _plain(annotation: Any) -> type | tuple[Any, ...] | None:
    """bool, int, float or str, or a Literal's choices, for `annotation` or its optional
    form; None for anything else (models, mappings: ``--faults`` sets those)."""
    if get_origin(annotation) in (Union, types.UnionType):
        others = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(others) != 1:
            return None
        annotation = others[0]
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    return annotation if annotation in (bool, int, float, str) else None
