"""No text from users, engines or GPUs is markup or reaches the terminal as control bytes
(issue 33, item 2). On a shared server one user's command, project or run name lands in
every other user's `ps`, `top`, `usage` and `images`: a `[/]` in it made every `gpuenv ps`
exit 1, a `[link=…]` became a hyperlink, and escape bytes went to the terminal as they
were. Each nasty text goes into every field it can reach, and every view is drawn both
piped (plain rows) and on a terminal (rich's table)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from gpuenv.cli.context import Application
from gpuenv.cli.tree import main
from gpuenv.common.text import visible
from gpuenv.engine.protocol import ImageInfo
from gpuenv.monitoring.usage import UsageLog
from gpuenv.reservations.claims import ClaimStore
from tests.scripted_nvml import ScriptedNvml, gpu, scenario
from tests.unit.fake_engine import FakeEngine

LONG = "n" * 10_000

NASTY = {
    "closing tag": "[/]",
    "hyperlink markup": "[link=file:///etc/passwd]x[/link]",
    "OSC 8 hyperlink": "\x1b]8;;file:///etc/passwd\x1b\\click\x1b]8;;\x1b\\",
    "clear screen": "\x1b[2J\x1b[H",
    "bidi override": "train\u202eyp.exe",
    "C1 control": "a\x9bb",
    "line separator": "a\u2028b",
    "10,000 characters": LONG,
}

# What must never reach a terminal: an escape that is not rich's own colour (SGR `m`),
# OSC sequences (hyperlinks, titles), C1 controls, BiDi overrides, line separators.
FORBIDDEN = ("\x1b]", "\x1b[2J", "\x1b[H", "\x9b", "\u202e", "\u2028", "[/]\x1b", LONG)


def leaks(text: str) -> list[str]:
    return [repr(bad) for bad in FORBIDDEN if bad in text]


class ListingEngine(FakeEngine):
    """A fake engine that lists one gpuenv run and one gpuenv image carrying `text`."""

    def __init__(self, text: str) -> None:
        super().__init__()
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 65))
        self.listed = [
            {
                "Id": "c" * 64,
                "Names": [f"/{text}"],
                "Image": f"gpuenv/{text}:1",
                "State": "running",
                "Labels": {
                    "io.gpuenv.run": "1",
                    "io.gpuenv.project": text,
                    "io.gpuenv.user": f"{text} (1000)",
                    "io.gpuenv.gpus": "GPU-00000000-1111-2222-3333-444444444444",
                    "io.gpuenv.command": f"python3 {text}",
                    "io.gpuenv.started": started,
                    "io.gpuenv.pid": "123",
                },
            }
        ]
        self.text = text

    def images(self, label: str | None = None) -> list[ImageInfo]:
        return [
            ImageInfo(
                id="sha256:" + "d" * 64,
                tags=(f"gpuenv/{self.text}:abc",),
                labels={"io.gpuenv.project": self.text, "io.gpuenv.project-dir": "/nowhere"},
                size=10**9,
                created=int(time.time()) - 100,
            )
        ]


@pytest.fixture(params=list(NASTY), ids=list(NASTY))
def nasty(
    request: pytest.FixtureRequest,
    nvml: ScriptedNvml,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    """A host whose GPU 0 is named with the text, held by a claim of a project named with
    it, with a usage record and an engine listing a run and an image named with it."""
    text = NASTY[request.param]
    nvml.write(scenario(gpu(0, name=f"NVIDIA {text}"), gpu(1)))
    state = tmp_path / "state"
    monkeypatch.setenv("GPUENV_STATE_DIR", str(state))
    store = ClaimStore(str(state))
    with store.locked():
        store.add(["GPU-00000000-1111-2222-3333-444444444444"], text)
    request.addfinalizer(store.close)
    log = UsageLog(str(state))
    run = log.begin(text, [("GPU-x", f"NVIDIA {text}")], start=time.time() - 3600)
    log.finish(run, 0)
    return text


def _with_engine(text: str) -> Application:
    """The application object of a command whose engine lists a run and an image named
    with the text."""
    return Application(connected=ListingEngine(text))


@pytest.mark.parametrize(
    "command",
    [["ps"], ["top", "--once"], ["doctor"], ["usage"], ["usage", "--by", "project"], ["images"]],
    ids=lambda c: " ".join(c),
)
def test_piped_views_show_the_text_and_nothing_else(nasty: str, command: list[str]) -> None:
    """(`usage` by user shows this process's user; `doctor` shows only the GPU's name,
    whose control characters the NVML reader already replaces with '?'.)"""
    result = CliRunner().invoke(main, command, env={"COLUMNS": "250"}, obj=_with_engine(nasty))
    assert "internal error" not in result.output, result.output
    assert result.exit_code in (0, 15), result.output  # doctor: 15 when a check fails
    assert not leaks(result.stdout) and not leaks(result.stderr), leaks(result.stdout) + leaks(
        result.stderr
    )
    if nasty != LONG and command not in (["usage"], ["doctor"]):
        assert visible(nasty) in result.stdout + result.stderr


def test_the_json_keeps_the_whole_text(nasty: str) -> None:
    """--json is data: the text as it is (JSON escapes control characters itself)."""
    result = CliRunner().invoke(main, ["ps", "--json"], obj=_with_engine(nasty))
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.stdout)
    assert run["project"] == nasty and run["command"] == f"python3 {nasty}"


def terminal_render(renderable: Any) -> str:
    console = Console(file=io.StringIO(), force_terminal=True, width=250, color_system="truecolor")
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_drawn_tables_show_the_text_and_nothing_else(nasty: str) -> None:
    """The tables rich draws on a terminal: a markup tag in the text is neither applied
    (a hyperlink is an OSC 8 sequence) nor a crash."""
    from gpuenv.app.top import top_snapshot
    from gpuenv.cli.views import images_table, runs_table, top_view
    from gpuenv.images.inventory import list_images
    from gpuenv.monitoring.monitor import list_runs

    engine = ListingEngine(nasty)
    drawn = terminal_render(runs_table(list_runs(engine, show_all=True)))
    host, rows = top_snapshot(lambda: engine)
    drawn += terminal_render(top_view(host, rows))
    drawn += terminal_render(images_table(list_images(engine, None, ())))
    assert not leaks(drawn), leaks(drawn)
    assert "\x1b]8;" not in drawn  # no hyperlink
    if nasty == "[link=file:///etc/passwd]x[/link]":
        assert drawn.count("[link=file:///etc/passwd]x[/link]") >= 3


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text", "plain text"),
        ("tab\there", "tab\\x09here"),
        ("\x00\x07\x7f", "\\x00\\x07\\x7f"),
        ("\u2066isolate\u2069", "\\u2066isolate\\u2069"),
        ("ünïcödé ✓ 日本", "ünïcödé ✓ 日本"),  # printable text stays as it is
    ],
)
def test_visible(text: str, shown: str) -> None:
    assert visible(text) == shown
