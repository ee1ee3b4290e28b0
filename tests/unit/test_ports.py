"""Published ports (issue 34, item 1): the forms `-p` and `ports:` take, what the Engine
API is sent, what is read back, and a taken host port refused before anything starts."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuenv.cli.tree import main
from gpuenv.containers.publish import check_free, port_taken
from gpuenv.errors import SpecError, StartError
from gpuenv.project.ports import Port, engine_ports, listed, merged, parse_port, published
from gpuenv.project.validate import load_spec


@pytest.mark.parametrize(
    ("text", "port"),
    [
        ("8888", Port(8888)),
        (8888, Port(8888)),
        ("0:6006", Port(6006)),
        ("9000:8000", Port(8000, 9000)),
        ("127.0.0.1::8888", Port(8888)),
        ("0.0.0.0:9000:8000", Port(8000, 9000, "0.0.0.0")),
        ("10.1.2.3:0:8000/udp", Port(8000, 0, "10.1.2.3", "udp")),
        ("[::1]:8000", Port(8000, 0, "::1")),
        ("[::]:7000:8000", Port(8000, 7000, "::")),
    ],
)
def test_the_forms_a_port_is_written_in(text: object, port: Port) -> None:
    assert parse_port(text) == port
    assert parse_port(str(parse_port(text))) == port  # its text reads back the same


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("0", "container's port must be 1 to 65535"),
        ("70000", "container's port must be 1 to 65535"),
        ("1.2.3.4:70000:80", "host's port must be 0"),
        ("localhost:80:80", "is not a port to publish"),
        ("8000-8010", "is not a port to publish"),
        ("999.1.1.1:1:80", "is not an IP address"),
        ("224.0.0.1:0:80", "multicast"),
        (True, "write a port as"),
        ("80/sctp", "is not a port to publish"),
    ],
)
def test_what_is_no_port_is_said(text: object, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        parse_port(text)


def test_loopback_unless_said_and_every_interface_only_in_so_many_words() -> None:
    assert parse_port("8888").address == "127.0.0.1"
    assert not parse_port("9000:8000").everywhere
    assert parse_port("0.0.0.0:9000:8000").everywhere and parse_port("[::]:1:2").everywhere


def test_the_command_line_wins_per_container_port() -> None:
    spec = (Port(8888), Port(6006, 7006))
    ports = merged(spec, [Port(8888, 9999), Port(8000)])
    assert ports == (Port(8888, 9999), Port(6006, 7006), Port(8000))


def test_what_the_engine_is_sent_and_what_is_read_back() -> None:
    exposed, bindings = engine_ports([Port(8888), Port(6006, 7006, "0.0.0.0")])
    assert exposed == {"8888/tcp": {}, "6006/tcp": {}}
    assert bindings == {
        "8888/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}],  # empty: the engine picks
        "6006/tcp": [{"HostIp": "0.0.0.0", "HostPort": "7006"}],
    }
    inspected = {"8888/tcp": [{"HostIp": "127.0.0.1", "HostPort": "49153"}], "22/tcp": None}
    assert published(inspected) == [Port(8888, 49153)]
    assert published(inspected)[0].url() == "http://127.0.0.1:49153/"
    rows = [{"IP": "127.0.0.1", "PrivatePort": 8888, "PublicPort": 49153, "Type": "tcp"}]
    assert listed([*rows, {"PrivatePort": 22, "Type": "tcp"}]) == [Port(8888, 49153)]
    assert Port(80, 8080, "::1").url() == "http://[::1]:8080/"


def test_a_taken_host_port_is_refused_before_anything_starts() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        with pytest.raises(StartError) as caught:
            check_free([Port(8000, taken)])
    assert caught.value.exit_code == 14
    assert f"127.0.0.1:{taken}" in caught.value.message
    assert "-p 0:8000" in (caught.value.hint or "")
    check_free([Port(8000), Port(8001, taken)])  # free again; 0 is never checked
    assert port_taken("Bind for 127.0.0.1:8000 failed: port is already allocated")
    assert not port_taken("no such image")


def test_ports_in_the_spec_are_located_and_never_force_a_relock(tmp_path: Path) -> None:
    (tmp_path / "gpuenv.yaml").write_text("framework: pytorch\nports: [8888, '0:6006']\n")
    spec = load_spec(str(tmp_path))
    assert spec.ports == (Port(8888), Port(6006))
    (tmp_path / "gpuenv.yaml").write_text("framework: pytorch\n")
    assert load_spec(str(tmp_path)).digest() == spec.digest()
    (tmp_path / "gpuenv.yaml").write_text("framework: pytorch\nports: [8888, 'x', 8888]\n")
    with pytest.raises(SpecError) as caught:
        load_spec(str(tmp_path))
    said = [str(p) for p in caught.value.problems]
    assert any("ports[1]" in p and "not a port to publish" in p for p in said), said
    assert any("ports[2]" in p and "listed twice" in p for p in said), said


@pytest.mark.parametrize(
    "args",
    [
        ["run", "-x", "--", "true"],
        ["run", "-d", "--pulbish", "0:8000", "--", "python3", "-m", "http.server"],
    ],
)
def test_an_option_run_does_not_know_is_a_usage_error_not_the_command(
    tmp_path: Path, args: list[str]
) -> None:
    """`gpuenv run -d --pulbish 0:8000 -- ...` once ran `--pulbish` as the command and
    said it started; now nothing starts and the option is named, exit 125 as `docker
    run` exits for an unknown flag."""
    result = CliRunner().invoke(main, ["-C", str(tmp_path), *args])
    assert result.exit_code == 125, result.output
    unknown = next(a for a in args if a in ("-x", "--pulbish"))
    assert f"No such option '{unknown}'" in result.output


def test_a_bad_publish_value_is_refused_before_anything_runs(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["-C", str(tmp_path), "run", "-p", "abc", "--", "true"])
    assert result.exit_code == 125  # gpuenv's own failure, as docker run's
    # the project is read first: without gpuenv.yaml that is what is said
    assert "gpuenv.yaml" in result.output


def test_a_notebook_is_a_run_of_jupyterlab_on_loopback_with_its_own_token() -> None:
    from gpuenv.app.notebook import TOKEN_ENV, notebook_options

    environ: dict[str, str] = {}
    options = notebook_options({"env": ("A=1",), "publish": ("6006",)}, 0, environ, uid=1000)
    token = environ[TOKEN_ENV]
    assert len(token) >= 32
    assert token not in " ".join(options["arguments"])  # never on its command line
    assert options["env"] == ("A=1", TOKEN_ENV)  # passed through, from `environ`
    assert options["publish"] == ("6006", "127.0.0.1:0:8888")
    assert options["url_paths"] == ((8888, f"lab?token={token}"),)
    assert options["needs_module"] == "jupyterlab" and options["interactive"] is False
    assert "--allow-root" not in options["arguments"]
    as_root = notebook_options({}, 8888, {}, uid=0)
    assert "--allow-root" in as_root["arguments"]
    assert as_root["publish"] == ("127.0.0.1:8888:8888",)
    assert notebook_options({}, 0, {}, uid=1000)["url_paths"] != options["url_paths"]
