"""The registry: `Bc-Type` + `Bc-Schema` ⇄ model, used for encoding and decoding alike.

Called by the runtime's consumer (decode) and outbox (encode), the reference gateway and
the tests. It never raises anything but `MessageError` on bad input.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeVar

from pydantic import ValidationError

from schemas.base import Message
from schemas.events import EVENT_TYPES
from schemas.facts import FACT_TYPES, Fact
from schemas.notices import NOTICE_TYPES

TYPE_HEADER = "Bc-Type"
SCHEMA_HEADER = "Bc-Schema"

M = TypeVar("M", bound=Message)


class MessageError(ValueError):
    """A message that cannot be decoded. `reason` is short, stable and names the field."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnknownMessageType(MessageError):
    pass


class UnsupportedMajor(UnknownMessageType):
    """A known type at a major version this code does not speak: not invalid, only newer
    (or older) than this reader. A worker parks it for redrive after an upgrade."""

    def __init__(self, bc_type: str, major: int, spoken: tuple[int, ...]) -> None:
        versions = ", ".join(str(v) for v in spoken)
        super().__init__(
            f"{bc_type} schema major {major} is not spoken here (this release speaks {versions})"
        )
        self.bc_type = bc_type
        self.major = major
        self.spoken = spoken


@functools.lru_cache(maxsize=64)  # a few distinct values, one per fact: parsed once each
def parse_major(raw: str) -> int:
    """The major of a `Bc-Schema` value: `N`, or `N.M` from a producer that also says its
    minor (tolerated: the minor only adds fields)."""
    match = _SCHEMA_RE.fullmatch(raw.strip())
    if match is None:
        raise UnknownMessageType(f"{SCHEMA_HEADER} is not a version: {raw!r}")
    return int(match.group(1))


_SCHEMA_RE = re.compile(r"([1-9][0-9]{0,5})(?:\.[0-9]{1,6})?")


class InvalidMessage(MessageError):
    """The body does not validate. `field` is the dotted path of the first bad field."""

    def __init__(self, bc_type: str, field: str, detail: str) -> None:
        where = f"field '{field}'" if field else "body"
        super().__init__(f"invalid {bc_type}: {where}: {detail}")
        self.field = field


# JSON can carry a NUL (`\u0000`) or a lone UTF-16 surrogate (`\ud800`) in a string;
# PostgreSQL stores neither (text nor jsonb). A body with such an escape is walked.
_MAYBE_UNSTORABLE = re.compile(rb"\\u(0000|[dD][89a-fA-F])")
#: a body that may hold a number that is not finite: the parser takes `NaN`, `Infinity`
#: and an exponent too large for a float (`1e999` is infinity), which no `jsonb` stores.
#: A hint, checked where it is (`_maybe_not_finite`): a fact id's hex (`…-4e123…`) or a
#: string is not a number, and walking a 1,000-entry flush for it costs more than
#: validating it
_NOT_FINITE_WORDS = (b"NaN", b"Infinity")
#: an exponent of three digits or more; one pattern per letter, so that each is searched
#: from its literal (a class `[eE]` is tried at every byte: 20 times slower)
_BIG_EXPONENTS = (re.compile(rb"e\+?0*[0-9]{3}"), re.compile(rb"E\+?0*[0-9]{3}"))
_NUMBER_CHARS = frozenset(b"0123456789.+-")
_SPACE = frozenset(b" \t\r\n")
_VALUE_STARTS = frozenset(b":,[")


def _hints_of_not_finite(body: bytes) -> Iterator[int]:
    for word in _NOT_FINITE_WORDS:
        at = body.find(word)
        while at >= 0:
            yield at
            at = body.find(word, at + 1)
    for pattern in _BIG_EXPONENTS:
        for hint in pattern.finditer(body):
            yield hint.start()


def _maybe_not_finite(body: bytes) -> bool:
    """Whether a hint of a non-finite number stands where a JSON value starts: after `:`,
    `,` or `[` and spaces, with only a number's characters between. A string that looks
    like one (`"x:1e999"`) is walked for nothing; no value that is one is missed."""
    for at in _hints_of_not_finite(body):
        while at and body[at - 1] in _NUMBER_CHARS:
            at -= 1
        while at and body[at - 1] in _SPACE:
            at -= 1
        if at and body[at - 1] in _VALUE_STARTS:
            return True
    return False


@functools.cache
def may_hold_not_finite(model: type[Message]) -> bool:
    """Whether a valid `model` can hold a number that is not finite: a field of any type
    (`dict[str, Any]`, say) or a float that allows them. A model whose every float refuses
    NaN and the infinities (and whose integers are strict: `1e999` is no integer) is
    refused such a body by its own validation, so its bodies are never searched for one —
    a liveness flush's search cost a sixth of its decode. Pure, of the model's schema."""
    return _holds_not_finite(model.__pydantic_core_schema__)


def _holds_not_finite(schema: object) -> bool:
    if isinstance(schema, list | tuple):
        return any(_holds_not_finite(item) for item in schema)
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind in ("any", "json", "complex"):
        return True
    if kind in ("float", "decimal") and schema.get("allow_inf_nan") is not False:
        return True
    return any(_holds_not_finite(value) for key, value in schema.items() if key != "cls")


def _unstorable_text(value: object) -> bool:
    """A string (or key) PostgreSQL cannot store: a NUL, or a lone surrogate."""
    if not isinstance(value, str):
        return False
    if "\x00" in value:
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _not_finite(value: object) -> bool:
    """A number no `jsonb` stores: NaN or an infinity."""
    return isinstance(value, float) and not math.isfinite(value)


def _first(value: object, path: str, bad: Callable[[object], bool]) -> str | None:
    """The dotted path of the first value (or key) of a decoded message that `bad` refuses,
    if any."""
    if bad(value):
        return path
    if isinstance(value, dict):
        for key, item in value.items():
            shown = "".join(c if c.isprintable() else "?" for c in str(key))[:64]
            where = f"{path}.{shown}" if path else shown
            if bad(key):
                return where
            found = _first(item, where, bad)
            if found is not None:
                return found
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _first(item, f"{path}.{index}" if path else str(index), bad)
            if found is not None:
                return found
    return None


def describe(error: ValidationError) -> tuple[str, str]:
    """The dotted path of a validation error's first problem ("" at the top) and what it
    says. Pure."""
    first = error.errors(include_url=False)[0]
    field = ".".join(str(part) for part in first["loc"])
    return field, first["msg"]


class Registry:
    """Maps (type, schema version) to a model class, and back."""

    def __init__(self, models: Iterable[type[Message]]) -> None:
        self._models: dict[tuple[str, int], type[Message]] = {}
        for model in models:
            key = (model.BC_TYPE, model.BC_SCHEMA)
            if key in self._models:
                raise ValueError(f"two models registered for {key}")
            self._models[key] = model

    @property
    def models(self) -> Mapping[tuple[str, int], type[Message]]:
        return dict(self._models)

    def headers_for(self, message: Message) -> dict[str, str]:
        key = (message.BC_TYPE, message.BC_SCHEMA)
        if self._models.get(key) is not type(message):
            raise UnknownMessageType(f"model {type(message).__name__} is not registered")
        return {TYPE_HEADER: message.BC_TYPE, SCHEMA_HEADER: str(message.BC_SCHEMA)}

    def encode(self, message: Message) -> tuple[bytes, dict[str, str]]:
        """The body (JSON, wire field names) and the `Bc-Type`/`Bc-Schema` headers."""
        headers = self.headers_for(message)
        return message.model_dump_json(by_alias=True).encode(), headers

    def model_for(self, headers: Mapping[str, str] | None) -> type[Message]:
        headers = headers or {}
        bc_type = headers.get(TYPE_HEADER)
        if not bc_type:
            raise UnknownMessageType(f"missing {TYPE_HEADER} header")
        major = parse_major(headers.get(SCHEMA_HEADER, "1"))
        model = self._models.get((bc_type, major))
        if model is None:
            spoken = tuple(sorted(v for (t, v) in self._models if t == bc_type))
            if spoken:
                raise UnsupportedMajor(bc_type, major, spoken)
            raise UnknownMessageType(f"unknown message type {bc_type!r}")
        return model

    def decode(self, headers: Mapping[str, str] | None, body: bytes) -> Message:
        """Validate `body` against the model the headers name. Raises `MessageError` only."""
        model = self.model_for(headers)
        return self.validate(model, body)

    @staticmethod
    def validate(model: type[M], body: bytes) -> M:
        try:
            message = model.model_validate_json(body)
        except ValidationError as error:
            field, detail = describe(error)
            raise InvalidMessage(model.BC_TYPE, field, detail) from error
        if _MAYBE_UNSTORABLE.search(body):  # cheap: only such a body is walked
            stored = message.model_dump(exclude=set(model.NEVER_STORED))
            where = _first(stored, "", _unstorable_text)
            if where is not None:
                raise InvalidMessage(
                    model.BC_TYPE, where, "a NUL or a lone surrogate, which no database stores"
                )
        if may_hold_not_finite(model) and _maybe_not_finite(body):  # likewise
            where = _first(message.model_dump(), "", _not_finite)
            if where is not None:
                raise InvalidMessage(
                    model.BC_TYPE, where, "a number that is not finite (NaN, Infinity, -Infinity)"
                )
        return message

    def decode_fact(self, headers: Mapping[str, str] | None, body: bytes) -> Fact:
        message = self.decode(headers, body)
        if not isinstance(message, Fact):
            raise UnknownMessageType(f"{message.BC_TYPE!r} is not a fact")
        return message


REGISTRY = Registry([*FACT_TYPES, *EVENT_TYPES, *NOTICE_TYPES])
