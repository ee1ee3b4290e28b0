"""Records: frozen dataclasses that cost nothing to define.

`@dataclass(frozen=True)` writes `__init__`, `__repr__`, `__eq__`, `__hash__`,
`__setattr__` and `__delattr__` as source and compiles each, for every class (about
1 ms a class on these machines), and importing `dataclasses` imports `inspect`, `ast`
and `dis` (about 10 ms more). `gpuenv run` defines some 35 such classes before its
container is created: with them as dataclasses, that was a third of its start-up.

`record` makes the same class with methods shared by every record, not compiled for
each, and without importing `dataclasses`:

>>> @record
... class Point:
...     x: int
...     y: int = 0
...     tags: tuple[str, ...] = field(default=(), compare=False)
>>> Point(1), Point(1, y=2) == Point(1, 2), hash(Point(1)) == hash(Point(1, tags=("a",)))
(Point(x=1, y=0, tags=()), True, True)
>>> replace(Point(1), y=5), asdict(Point(1))
(Point(x=1, y=5, tags=()), {'x': 1, 'y': 0, 'tags': ()})
>>> Point(1).x = 2
Traceback (most recent call last):
...
gpuenv.records.FrozenInstanceError: cannot assign to field 'x'

A record is still a dataclass to whoever asks: `dataclasses.fields`, `asdict`,
`replace` and `is_dataclass` work on it (its `__dataclass_fields__` is made the first
time one of them looks), and mypy checks it as a frozen dataclass (`dataclass_transform`).
`replace` and `asdict` here do the same without importing `dataclasses`, for records and
dataclasses alike.

What is supported is what gpuenv uses: fields with defaults and default factories,
`field(init=, repr=, compare=, hash=)`, ClassVar annotations (not fields),
`__post_init__`, inheritance from another record, the class's own methods taking
precedence, and `record(frozen=False)` for a mutable one (unhashable, as a dataclass
with eq is). A TypeError says what is not: InitVar, keyword-only fields, a dataclass
as a base; a ValueError refuses a mutable default, as dataclasses does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_: object) -> Callable[[Any], Any]:
        return lambda decorated: decorated


__all__ = ["MISSING", "Field", "FrozenInstanceError", "asdict", "field", "record", "replace"]

T = TypeVar("T", bound=type)
R = TypeVar("R")


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class FrozenInstanceError(AttributeError):
    """An assignment to a field of a frozen record (dataclasses' FrozenInstanceError)."""


class Field:
    """A field of a record: its name and annotation, and what `field()` said of it."""

    __slots__ = ("compare", "default", "default_factory", "hash", "init", "name", "repr", "type")

    def __init__(
        self,
        default: Any = MISSING,
        default_factory: Any = MISSING,
        init: bool = True,
        repr: bool = True,
        compare: bool = True,
        hash: bool | None = None,
    ) -> None:
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.name = ""
        self.type: Any = None
        self.default, self.default_factory = default, default_factory
        self.init, self.repr, self.compare, self.hash = init, repr, compare, hash

    def __repr__(self) -> str:
        return f"Field(name={self.name!r}, default={self.default!r}, init={self.init})"


def field(
    *,
    default: Any = MISSING,
    default_factory: Callable[[], Any] | Any = MISSING,
    init: bool = True,
    repr: bool = True,
    compare: bool = True,
    hash: bool | None = None,
) -> Any:
    """A field's default, default factory and flags, as `dataclasses.field` takes them."""
    return Field(default, default_factory, init, repr, compare, hash)


@overload
def record(cls: T, /) -> T: ...
@overload
def record(*, frozen: bool = True) -> Callable[[T], T]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
def record(cls: T | None = None, /, *, frozen: bool = True) -> T | Callable[[T], T]:
    """The class as a record (frozen unless `frozen=False`)."""

    def make(cls: T) -> T:
        return _record(cls, frozen)

    return make if cls is None else make(cls)


def _special(kind: object) -> str | None:
    """ClassVar (a class attribute, not a field), InitVar or KW_ONLY (refused) when a
    string annotation names one, bare or qualified by its module, as dataclasses reads
    them; else None."""
    if not isinstance(kind, str):
        return None
    name = kind.split("[", 1)[0].rsplit(".", 1)[-1].strip()
    return name if name in ("ClassVar", "InitVar", "KW_ONLY") else None


def _fields_of(cls: type) -> dict[str, Field]:
    """The record's fields in dataclasses' order: the bases' first (a redefined one keeps
    its place), then the class's own annotations."""
    fields: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        inherited = base.__dict__.get("__record_fields__")
        if inherited is not None:
            fields.update(inherited)
        elif "__dataclass_fields__" in base.__dict__:
            raise TypeError(f"{cls.__name__}: a record's bases are records, not dataclasses")
    # Not inspect.get_annotations: importing inspect is what records spare.
    for name, kind in cls.__dict__.get("__annotations__", {}).items():  # noqa: RUF063
        special = _special(kind)
        if special == "ClassVar":
            continue
        if special:
            raise TypeError(f"{cls.__name__}.{name}: records take no {special}")
        value = cls.__dict__.get(name, MISSING)
        spec = value if isinstance(value, Field) else Field(default=value)
        if spec.default is not MISSING and type(spec.default).__hash__ is None:
            raise ValueError(
                f"mutable default {type(spec.default)} for field {name} is not allowed: "
                "use default_factory"
            )
        if isinstance(value, Field):  # the class attribute is the default, as dataclasses leaves it
            if spec.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, spec.default)
        spec.name, spec.type = name, kind
        fields[name] = spec
    return fields


def _record(cls: T, frozen: bool) -> T:
    fields = _fields_of(cls)
    every = tuple(fields.values())
    # (name, default, default factory) of each field __init__ takes, then of the others
    takes = tuple((f.name, f.default, f.default_factory) for f in every if f.init)
    others = tuple((f.name, f.default, f.default_factory) for f in every if not f.init)
    defaulted = False
    for name, default, factory in takes:
        if default is MISSING and factory is MISSING and defaulted:
            raise TypeError(f"non-default argument {name!r} follows default argument")
        defaulted = defaulted or default is not MISSING or factory is not MISSING
    names = frozenset(fields)
    compared = tuple(f.name for f in every if f.compare)
    hashed = tuple(f.name for f in every if (f.compare if f.hash is None else f.hash))
    shown = tuple(f.name for f in every if f.repr)
    post_init = hasattr(cls, "__post_init__")
    setter = object.__setattr__
    klass: Any = cls  # for super() in the methods below

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(takes):
            raise TypeError(
                f"{cls.__name__}() takes {len(takes)} positional arguments, "
                f"but {len(args)} were given"
            )
        for position, (name, default, factory) in enumerate(takes):
            if position < len(args):
                if name in kwargs:
                    raise TypeError(f"{cls.__name__}() got multiple values for {name!r}")
                value = args[position]
            elif name in kwargs:
                value = kwargs.pop(name)
            elif default is not MISSING:
                value = default
            elif factory is not MISSING:
                value = factory()
            else:
                raise TypeError(f"{cls.__name__}() missing required argument: {name!r}")
            setter(self, name, value)
        if kwargs:
            raise TypeError(
                f"{cls.__name__}() got an unexpected keyword argument {next(iter(kwargs))!r}"
            )
        for name, default, factory in others:
            if default is not MISSING:
                setter(self, name, default)
            elif factory is not MISSING:
                setter(self, name, factory())
        if post_init:
            self.__post_init__()

    def __repr__(self: Any) -> str:
        shown_fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in shown)
        return f"{type(self).__qualname__}({shown_fields})"

    def __eq__(self: Any, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        mine = tuple(getattr(self, name) for name in compared)
        return mine == tuple(getattr(other, name) for name in compared)

    def __hash__(self: Any) -> int:
        return hash(tuple(getattr(self, name) for name in hashed))

    def __setattr__(self: Any, name: str, value: object) -> None:
        if type(self) is klass or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(klass, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is klass or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(klass, self).__delattr__(name)

    own = cls.__dict__
    own_hash = own.get("__hash__", MISSING)
    explicit_hash = not (own_hash is MISSING or (own_hash is None and "__eq__" in own))
    methods: dict[str, Any] = {"__init__": __init__, "__repr__": __repr__, "__eq__": __eq__}
    if frozen:
        methods |= {"__setattr__": __setattr__, "__delattr__": __delattr__}
    for name, method in methods.items():
        if name not in own:  # the class's own method stays, as with dataclasses
            method.__qualname__ = f"{cls.__qualname__}.{name}"
            setattr(cls, name, method)
    # As dataclasses decides: a __hash__ of the class's own stays; else a frozen record
    # hashes its fields, and a mutable one (compared by value) is unhashable.
    if not explicit_hash:
        setattr(cls, "__hash__", __hash__ if frozen else None)  # noqa: B010 - not the instance's
    setattr(cls, "__record_fields__", fields)  # noqa: B010
    setattr(cls, "__match_args__", tuple(name for name, _, _ in takes))  # noqa: B010
    setattr(cls, "__dataclass_fields__", _AsDataclass())  # noqa: B010
    return cls


class _AsDataclass:
    """A record's `__dataclass_fields__`, made when something first asks for it (the
    functions of `dataclasses`, which is imported by then): the record's fields as
    dataclasses' Field objects, taken from a dataclass made of the same annotations."""

    def __get__(self, instance: object, owner: type) -> dict[str, Any]:
        import dataclasses

        if "__record_fields__" not in owner.__dict__:  # a plain subclass of a record
            base = next(b for b in owner.__mro__ if "__record_fields__" in b.__dict__)
            inherited: dict[str, Any] = getattr(base, "__dataclass_fields__")  # noqa: B009
            return inherited
        namespace: dict[str, Any] = {"__module__": owner.__module__, "__annotations__": {}}
        for name, spec in owner.__dict__["__record_fields__"].items():
            namespace["__annotations__"][name] = spec.type
            namespace[name] = dataclasses.field(
                default=dataclasses.MISSING if spec.default is MISSING else spec.default,
                default_factory=(
                    dataclasses.MISSING if spec.default_factory is MISSING else spec.default_factory
                ),
                init=spec.init,
                repr=spec.repr,
                compare=spec.compare,
                hash=spec.hash,
            )
        shadow: Any = dataclasses.dataclass(
            type(owner.__name__, (), namespace), init=False, repr=False, eq=False
        )
        made: dict[str, Any] = shadow.__dataclass_fields__
        setattr(owner, "__dataclass_fields__", made)  # noqa: B010 - asked once
        return made


def replace(obj: R, /, **changes: Any) -> R:
    """`dataclasses.replace`, for records without importing dataclasses (and for a
    dataclass, by it)."""
    found: dict[str, Field] | None = getattr(type(obj), "__record_fields__", None)
    if found is None:
        import dataclasses

        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    for spec in found.values():
        if not spec.init:
            if spec.name in changes:
                raise ValueError(
                    f"field {spec.name} is declared with init=False, it cannot be specified "
                    "with replace()"
                )
        elif spec.name not in changes:
            changes[spec.name] = getattr(obj, spec.name)
    return type(obj)(**changes)


def asdict(obj: Any) -> dict[str, Any]:
    """`dataclasses.asdict`, for records without importing dataclasses: fields to a
    dict, recursing into records, dataclasses, lists, tuples and dicts (values copied)."""
    if getattr(type(obj), "__record_fields__", None) is None:
        import dataclasses

        return dataclasses.asdict(obj)
    result = _plain(obj)
    assert isinstance(result, dict)
    return result


def _plain(value: Any) -> Any:
    kind = type(value)
    found = getattr(kind, "__record_fields__", None)
    if found is not None:
        return {name: _plain(getattr(value, name)) for name in found}
    if hasattr(kind, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return kind(*[_plain(v) for v in value])
    if isinstance(value, (list, tuple)):
        return kind(_plain(v) for v in value)
    if isinstance(value, dict):
        return kind((_plain(k), _plain(v)) for k, v in value.items())
    if kind in (str, int, float, bool, type(None)):
        return value  # what deepcopy gives back
    import copy

    return copy.deepcopy(value)
