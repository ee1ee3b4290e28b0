"""A record behaves as the dataclass it stands for: each case builds the same class body
both ways and holds what they do side by side."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from gpuenv import records
from gpuenv.records import FrozenInstanceError, asdict, field, record, replace

Decorate = Callable[[type], type]
Body = Callable[[Decorate, Callable[..., Any]], type]


def _pair(body: Body, frozen: bool = True) -> list[type]:
    """The class made by `body` as a dataclass, then as a record (each with its field)."""
    return [
        body(dataclass(frozen=frozen), dataclasses.field),
        body(record if frozen else record(frozen=False), records.field),
    ]


def _plain(decorate: Decorate, field: Callable[..., Any]) -> type:
    @decorate
    class Gpu:
        """A GPU."""

        index: int
        name: str
        uuid: str | None = None
        processes: tuple[int, ...] = ()
        labels: dict[str, str] = field(default_factory=dict, compare=False)
        node: Any = field(default=None, repr=False, compare=False)
        seen: int = field(default=0, hash=False)

    return Gpu


def _outcome(action: Callable[[], Any]) -> Any:
    """What an action gives, or the kind of exception it raises (dataclasses' frozen error
    and ours are one kind)."""
    try:
        return action()
    except (dataclasses.FrozenInstanceError, FrozenInstanceError):
        return "frozen"
    except Exception as exc:
        return type(exc)


CASES: list[tuple[str, Callable[[type], Any]]] = [
    ("positional", lambda c: repr(c(0, "A100"))),
    ("keywords", lambda c: repr(c(name="H100", index=1, uuid="GPU-1"))),
    ("factory per instance", lambda c: c(0, "a").labels is not c(0, "a").labels),
    ("equal", lambda c: c(0, "a", node=1) == c(0, "a", node=2)),
    ("unequal", lambda c: c(0, "a") == c(1, "a")),
    ("hash ignores uncompared", lambda c: hash(c(0, "a", node=1)) == hash(c(0, "a", node=2))),
    ("hash=False compared", lambda c: c(0, "a", seen=1) == c(0, "a", seen=2)),
    ("hash=False not hashed", lambda c: hash(c(0, "a", seen=1)) == hash(c(0, "a", seen=2))),
    ("not equal to a tuple", lambda c: c(0, "a") == (0, "a")),
    ("missing", lambda c: c(0)),
    ("too many", lambda c: c(0, "a", None, (), {}, None, 0, 7)),
    ("unknown keyword", lambda c: c(0, "a", colour="red")),
    ("twice", lambda c: c(0, "a", index=1)),
    ("frozen", lambda c: setattr(c(0, "a"), "index", 2)),
    ("frozen delete", lambda c: delattr(c(0, "a"), "index")),
    ("frozen new attribute", lambda c: setattr(c(0, "a"), "other", 2)),
    ("replace", lambda c: repr(dataclasses.replace(c(0, "a"), uuid="GPU-9"))),
    ("asdict", lambda c: dataclasses.asdict(c(0, "a", processes=(3,)))),
    ("fields", lambda c: [f.name for f in dataclasses.fields(c)]),
    ("is a dataclass", lambda c: dataclasses.is_dataclass(c(0, "a"))),
    ("match args", lambda c: c.__match_args__),
    ("copy", lambda c: copy.copy(c(0, "a")) == c(0, "a")),
    ("deepcopy", lambda c: copy.deepcopy(c(0, "a", labels={"k": "v"})) == c(0, "a", {"k": "v"})),
    ("in a set", lambda c: len({c(0, "a"), c(0, "a"), c(1, "a")})),
]


@pytest.mark.parametrize(("case", "action"), CASES, ids=[case for case, _ in CASES])
def test_a_frozen_record_does_what_its_dataclass_does(
    case: str, action: Callable[[type], Any]
) -> None:
    made, recorded = _pair(_plain)
    assert _outcome(lambda: action(recorded)) == _outcome(lambda: action(made)), case


def test_the_frozen_error_names_the_field() -> None:
    gpu = _plain(record, records.field)(0, "a")
    with pytest.raises(FrozenInstanceError, match="cannot assign to field 'index'"):
        gpu.index = 1  # type: ignore[attr-defined]


def _mutable(decorate: Decorate, field: Callable[..., Any]) -> type:
    @decorate
    class Totals:
        """Sums."""

        hours: float = 0.0
        by_model: dict[str, float] = field(default_factory=dict)

    return Totals


MUTABLE: list[tuple[str, Callable[[type], Any]]] = [
    ("assign", lambda c: (lambda t: (setattr(t, "hours", 2.0), t.hours)[1])(c())),
    ("equal", lambda c: c(1.0) == c(1.0)),
    ("unhashable", lambda c: hash(c())),
    ("repr", lambda c: repr(c(1.5, {"A100": 1.5}))),
]


@pytest.mark.parametrize(("case", "action"), MUTABLE, ids=[case for case, _ in MUTABLE])
def test_a_mutable_record_does_what_its_dataclass_does(
    case: str, action: Callable[[type], Any]
) -> None:
    made, recorded = _pair(_mutable, frozen=False)
    assert _outcome(lambda: action(recorded)) == _outcome(lambda: action(made)), case


def _own_methods(decorate: Decorate, field: Callable[..., Any]) -> type:
    @decorate
    class Claim:
        """A claim whose own methods stay."""

        key: str
        owner: str = ""
        derived: str = field(default="", init=False)

        def __post_init__(self) -> None:
            object.__setattr__(self, "derived", self.key.upper())

        def __repr__(self) -> str:
            return f"<claim {self.key}>"

        def __eq__(self, other: object) -> bool:
            return isinstance(other, type(self)) and other.key == self.key

    return Claim


OWN: list[tuple[str, Callable[[type], Any]]] = [
    ("post init", lambda c: c("gpu-0").derived),
    ("own repr", lambda c: repr(c("gpu-0"))),
    ("own eq", lambda c: c("gpu-0", "alice") == c("gpu-0", "bob")),
    ("hash from fields", lambda c: hash(c("gpu-0")) == hash(c("gpu-0"))),
    ("init=False field refused", lambda c: c("gpu-0", "a", "b")),
]


@pytest.mark.parametrize(("case", "action"), OWN, ids=[case for case, _ in OWN])
def test_a_records_own_methods_stay_as_a_dataclasss_do(
    case: str, action: Callable[[type], Any]
) -> None:
    made, recorded = _pair(_own_methods)
    assert _outcome(lambda: action(recorded)) == _outcome(lambda: action(made)), case


def test_a_record_inherits_a_records_fields() -> None:
    @record
    class Base:
        """A base."""

        name: str
        size: int = 0

    @record
    class Child(Base):
        """A child with a field more."""

        colour: str = "red"

    child = Child("x", 2, "blue")
    assert (child.name, child.size, child.colour) == ("x", 2, "blue")
    assert (
        repr(child)
        == "test_a_record_inherits_a_records_fields.<locals>.Child(name='x', size=2, colour='blue')"
    )
    assert child != Base("x", 2)  # another class, as with dataclasses
    with pytest.raises(FrozenInstanceError):
        child.size = 3  # type: ignore[misc]


def test_a_record_refuses_what_it_does_not_do() -> None:
    @dataclass(frozen=True)
    class Plain:
        """A dataclass."""

        name: str

    with pytest.raises(TypeError, match="bases are records"):

        @record
        class Child(Plain):
            """Not allowed: a dataclass base."""

    with pytest.raises(TypeError, match="kw_only"):

        @record
        class Keyword:
            """Not allowed: keyword-only fields."""

            name: str = field(kw_only=True)


def test_a_record_pickles_like_a_dataclass() -> None:
    assert pickle.loads(pickle.dumps(Sample("a", 1))) == Sample("a", 1)


@record
class Sample:
    """A module-level record, as pickle needs."""

    name: str
    size: int = 0


def _nested(decorate: Decorate, field: Callable[..., Any]) -> type:
    @decorate
    class Process:
        """A process."""

        pid: int
        name: str = ""

    @decorate
    class Gpu:
        """A GPU with processes, readings and notes."""

        kind: ClassVar[str] = "gpu"  # a class attribute, not a field
        index: int
        processes: tuple[Any, ...] = ()
        readings: dict[str, Any] = field(default_factory=dict)
        notes: list[Any] = field(default_factory=list)
        derived: str = field(default="", init=False)

    Gpu.Process = Process  # type: ignore[attr-defined]
    return Gpu


def _sample(cls: Any) -> Any:
    process = cls.Process
    return cls(
        0,
        (process(1, "python"), process(2)),
        {"temp": 60, "by": [process(3)]},
        [process(4), (5, "six")],
    )


NESTED: list[tuple[str, Callable[[Any], Any]]] = [
    ("asdict, ours", lambda c: asdict(_sample(c))),
    ("asdict, dataclasses'", lambda c: dataclasses.asdict(_sample(c))),
    ("replace, ours", lambda c: asdict(replace(_sample(c), index=3))),
    ("replace, dataclasses'", lambda c: asdict(dataclasses.replace(_sample(c), index=3))),
    ("replace init=False, ours", lambda c: replace(_sample(c), derived="x")),
    ("replace init=False, dataclasses'", lambda c: dataclasses.replace(_sample(c), derived="x")),
    ("fields", lambda c: [(f.name, f.init, f.compare) for f in dataclasses.fields(c)]),
    ("defaults", lambda c: [f.default for f in dataclasses.fields(c)]),
    ("class attribute", lambda c: (c.kind, "kind" in [f.name for f in dataclasses.fields(c)])),
    ("asdict copies", lambda c: (lambda g: asdict(g)["readings"] is not g.readings)(_sample(c))),
]


@pytest.mark.parametrize(("case", "action"), NESTED, ids=[case for case, _ in NESTED])
def test_asdict_and_replace_do_what_dataclasses_do(case: str, action: Callable[[Any], Any]) -> None:
    made, recorded = _pair(_nested)
    assert _outcome(lambda: action(recorded)) == _outcome(lambda: action(made)), case


def _mutable_default(decorate: Decorate, field: Callable[..., Any]) -> type:
    @decorate
    class Bad:
        """A list as a default."""

        items: list[int] = []  # noqa: RUF012 - what is refused

    return Bad


def _default_first(decorate: Decorate, field: Callable[..., Any]) -> type:
    @decorate
    class Bad:
        """A field without a default after one with."""

        first: int = 0
        second: int  # type: ignore[misc]

    return Bad


@pytest.mark.parametrize("body", [_mutable_default, _default_first], ids=["mutable", "order"])
def test_a_record_refuses_what_a_dataclass_refuses(body: Body) -> None:
    refused = []
    for decorate, specify in [
        (dataclass(frozen=True), dataclasses.field),
        (record, records.field),
    ]:
        with pytest.raises((TypeError, ValueError)) as raised:
            body(decorate, specify)
        refused.append(raised.type)
    assert refused[0] is refused[1]


def test_asdict_and_replace_take_dataclasses_too() -> None:
    made = _nested(dataclass(frozen=True), dataclasses.field)
    sample = _sample(made)
    assert asdict(sample) == dataclasses.asdict(sample)
    assert replace(sample, index=7) == dataclasses.replace(sample, index=7)


def test_a_record_needs_no_dataclasses_and_the_core_run_modules_do_not_load_them() -> None:
    """Importing dataclasses imports inspect, ast and dis. The core modules a plain
    `gpuenv run` imports, and using their records, load neither. (The engine's value
    types are plain dataclasses since its one adapter is docker-py's, whose start-up
    cost a run accepts: `engine.*`, and `run.session` through `engine.protocol`, are
    not in the list.)"""
    run_path = [
        "gpuenv.cli.fast",
        "gpuenv.cli.running",
        "gpuenv.run.launch",
        "gpuenv.run.container",
        "gpuenv.run.devices",
        "gpuenv.run.preflight",
        "gpuenv.images.build",
        "gpuenv.images.accounts",
        "gpuenv.project.stamp",
        "gpuenv.project.spec",
        "gpuenv.project.mounts",
        "gpuenv.resolution.host",
        "gpuenv.resolution.locked",
        "gpuenv.resolution.cache",
        "gpuenv.resolution.matrix_files",
        "gpuenv.sharing.gpus",
        "gpuenv.sharing.reserve",
        "gpuenv.sharing.holders",
        "gpuenv.sharing.claims",
        "gpuenv.sharing.usage",
    ]
    code = (
        "import sys, importlib\n"
        f"for name in {run_path!r}:\n    importlib.import_module(name)\n"
        "from gpuenv.resolution.machine import Gpu, GpuProcess, Host\n"
        "host = Host('550.54.15', (Gpu(0, 'A100', processes=(GpuProcess(1, 10),)),), 'test')\n"
        "host.describe()\n"
        "from gpuenv.records import replace\n"
        "replace(host, driver='560.35.03')\n"
        "print(sorted({'dataclasses', 'inspect', 'ast'} & set(sys.modules)))\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]"
