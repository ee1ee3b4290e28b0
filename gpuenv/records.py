"""Records: dataclasses without the cost of compiling their methods.

`@dataclass(frozen=True)` writes `__init__`, `__repr__`, `__eq__`, `__hash__`,
`__setattr__` and `__delattr__` as source and compiles each, for every class: about
1 ms a class on these machines, and `gpuenv run` imports some 35 of them before its
container is created (a third of its own start-up). `record` makes the same class —
`dataclasses.fields`, `asdict` and `replace` work on it, mypy checks it as a frozen
dataclass — with those methods shared by every record, not compiled for each:

>>> @record
... class Point:
...     x: int
...     y: int = 0
...     tags: tuple[str, ...] = field(default=(), compare=False)
>>> Point(1), Point(1, y=2) == Point(1, 2), hash(Point(1)) == hash(Point(1, tags=("a",)))
(Point(x=1, y=0, tags=()), True, True)
>>> Point(1).x = 2
Traceback (most recent call last):
...
dataclasses.FrozenInstanceError: cannot assign to field 'x'

What is supported is what gpuenv uses: fields with defaults and default factories,
`field(init=, repr=, compare=, hash=)`, `__post_init__`, inheritance from another
record, methods of the class's own taking precedence, and `record(frozen=False)` for
a mutable one (unhashable, as a dataclass with eq is). Not supported (a TypeError says
so): InitVar, keyword-only fields, slots, ordering.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import MISSING, Field, FrozenInstanceError, field
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_: object) -> Callable[[Any], Any]:
        return lambda decorated: decorated


__all__ = ["field", "record"]

T = TypeVar("T", bound=type)


@overload
def record(cls: T, /) -> T: ...
@overload
def record(*, frozen: bool = True) -> Callable[[T], T]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
def record(cls: T | None = None, /, *, frozen: bool = True) -> T | Callable[[T], T]:
    """The class as a dataclass (frozen unless `frozen=False`), its methods shared."""

    def make(cls: T) -> T:
        return _record(cls, frozen)

    return make if cls is None else make(cls)


def _record(cls: T, frozen: bool) -> T:
    for base in cls.__mro__[1:]:
        params = base.__dict__.get("__dataclass_params__")
        if params is not None and not getattr(base, "__record__", False):
            raise TypeError(f"{cls.__name__}: a record's bases are records, not dataclasses")
    # Fields only: with these flags dataclasses compiles nothing.
    if "__doc__" not in cls.__dict__ or cls.__doc__ is None:
        cls.__doc__ = cls.__name__  # else dataclasses asks inspect for a signature
    made: type = dataclasses.dataclass(cls, init=False, repr=False, eq=False)
    every = dataclasses.fields(made)
    for each in every:
        if each.kw_only is True or type(each.type) is dataclasses.InitVar:
            raise TypeError(f"{cls.__name__}.{each.name}: records take no kw_only or InitVar")
    names = frozenset(each.name for each in every)
    compared = tuple(each.name for each in every if each.compare)
    hashed = tuple(
        each.name for each in every if (each.compare if each.hash is None else each.hash)
    )
    shown = tuple(each.name for each in every if each.repr)
    post_init = hasattr(made, "__post_init__")
    setter = object.__setattr__
    klass: Any = made  # for super() in the methods below

    # (name, default, default factory) of each field __init__ takes, then of the others
    takes = tuple((each.name, each.default, each.default_factory) for each in every if each.init)
    others = tuple(
        (each.name, each.default, each.default_factory) for each in every if not each.init
    )

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
        if type(self) is made or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(klass, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is made or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(klass, self).__delattr__(name)

    own = made.__dict__
    own_hash = own.get("__hash__", MISSING)
    explicit_hash = not (own_hash is MISSING or (own_hash is None and "__eq__" in own))
    methods: dict[str, Any] = {"__init__": __init__, "__repr__": __repr__, "__eq__": __eq__}
    if frozen:
        methods |= {"__setattr__": __setattr__, "__delattr__": __delattr__}
    for name, method in methods.items():
        if name not in own:  # the class's own method stays, as with dataclasses
            method.__qualname__ = f"{cls.__qualname__}.{name}"
            setattr(made, name, method)
    # As dataclasses decides: a __hash__ of the class's own stays; else a frozen record
    # hashes its fields, and a mutable one (compared by value) is unhashable.
    if not explicit_hash:
        made.__hash__ = __hash__ if frozen else None  # type: ignore[assignment]
    made.__record__ = True  # type: ignore[attr-defined]
    return made  # type: ignore[return-value]
