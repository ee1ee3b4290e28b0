"""`gpuenv matrix sync`: rows derived from NGC image metadata, and their merge over the
shipped matrix (new tag, filled field, disagreement), with a fake registry."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpuenv.app.matrix import Synced, SyncSource, sync_matrix
from gpuenv.cli.tree import main
from gpuenv.common.versions import DriverVersion
from gpuenv.engine.protocol import Manifest, UnknownRepository
from gpuenv.errors import MatrixError
from gpuenv.matrix import overlay
from gpuenv.matrix.load import Matrix, load_matrix
from gpuenv.matrix.overlay import OverlayRow, disagreements, merge
from gpuenv.matrix.sync import derive, parse_requirement, platforms_of, sync

PYTORCH = "nvcr.io/nvidia/pytorch"
DIGEST = "sha256:" + "d" * 64

# nvcr.io/nvidia/pytorch:25.10-py3, from its published image history (see
# scripts/services.sh, sync_standin_env): the variables NGC images carry.
ENV_25_10 = [
    "CUDA_VERSION=13.0.2.006",
    "CUDA_DRIVER_VERSION=580.95.05",
    "NVIDIA_REQUIRE_CUDA=cuda>=9.0",
    "NCCL_VERSION=2.27.7",
    "CUDNN_VERSION=9.14.0.64",
    "CUDA_ARCH_LIST=7.5 8.0 8.6 9.0 10.0 12.0",
    "PYTORCH_BUILD_VERSION=2.9.0a0+145a3a7",
    "NVIDIA_PYTORCH_VERSION=25.10",
]
UBUNTU = {
    "org.opencontainers.image.ref.name": "ubuntu",
    "org.opencontainers.image.version": "24.04",
}
# The nvidia/cuda images' requirement (matrix-audit.md: the 13.0.2 branches).
CUDA_13_0_2_REQUIRE = (
    "cuda>=13.0 brand=unknown,driver>=535,driver<536 brand=tesla,driver>=535,driver<536 "
    "brand=nvidia,driver>=535,driver<536 brand=tesla,driver>=550,driver<551 "
    "brand=tesla,driver>=570,driver<571 brand=tesla,driver>=575,driver<576"
)


def _config(env: list[str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"architecture": "amd64", "os": "linux", "config": {"Env": env, "Labels": labels}}


def _floor(cuda: str) -> str | None:
    return {"13.0": "580.65.06", "12.4": "550.54.14"}.get(cuda)


@pytest.mark.parametrize(
    ("text", "min_cuda", "branches"),
    [
        ("cuda>=9.0", "9.0", ()),  # every NGC framework image (PyTorch 21.12, 25.10)
        (CUDA_13_0_2_REQUIRE, "13.0", ("535", "550", "570", "575")),
        ("brand=tesla,driver>=470,driver<471 cuda>=12.4", "12.4", ("470",)),
        ("brand=geforce,driver>=470,driver<471", None, ()),  # not a data-center branch
        ("", None, ()),
    ],
)
def test_requirement(text: str, min_cuda: str | None, branches: tuple[str, ...]) -> None:
    requirement = parse_requirement(text)
    assert (requirement.min_cuda, requirement.branches) == (min_cuda, branches)


@pytest.mark.parametrize(
    ("env", "labels", "expected"),
    [
        (
            ENV_25_10,
            UBUNTU,
            {
                "release": "25.10",
                "framework_version": "2.9.0a0+145a3a7",
                "cuda": "13.0.2",
                "cudnn": "9.14.0.64",
                "nccl": "2.27.7",
                "ubuntu": "24.04",
                "min_driver": None,  # cuda>=9.0 is below the image's own CUDA: no minimum
                "built_for_driver": "580.95.05",
                "forward_compat": None,
                "min_compute_capability": "7.5",
            },
        ),
        (  # PyTorch 21.12's environment (a public dump): TORCH_CUDA_ARCH_LIST is not read
            [
                "CUDA_VERSION=11.5.0.029",
                "CUDNN_VERSION=8.3.1.22",
                "PYTORCH_BUILD_VERSION=1.11.0a0+b6df043",
                "NVIDIA_PYTORCH_VERSION=21.12",
                "TORCH_CUDA_ARCH_LIST=5.2 6.0 6.1 7.0 7.5 8.0 8.6+PTX",
            ],
            None,
            {"release": "21.12", "cuda": "11.5.0", "ubuntu": None, "min_compute_capability": None},
        ),
        (  # an nvidia/cuda image: the requirement states the minimum and the branches
            ["CUDA_VERSION=13.0.2", f"NVIDIA_REQUIRE_CUDA={CUDA_13_0_2_REQUIRE}"],
            None,
            {"min_driver": "580.65.06", "forward_compat": ["535", "550", "570", "575"]},
        ),
        (  # Triton spells cuDNN with its CUDA: the version is what is kept
            ["CUDA_VERSION=12.3.2.001", "CUDNN_VERSION=8.9.7.29+cuda12.2"],
            None,
            {"cuda": "12.3.2", "cudnn": "8.9.7.29"},
        ),
    ],
)
def test_derive(env: list[str], labels: dict[str, str] | None, expected: dict[str, Any]) -> None:
    tag = f"{expected.get('release', '13.0.2')}-py3"
    row = derive("pytorch", PYTORCH, tag, DIGEST, ["linux/amd64"], _config(env, labels), _floor)
    assert row is not None
    assert {name: row.to_data()[name] for name in expected} == expected


def test_an_image_without_ngc_metadata_gives_no_row() -> None:
    config = _config(["PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all"])
    assert derive("pytorch", PYTORCH, "24.05-py3", DIGEST, [], config, _floor) is None


@pytest.mark.parametrize(
    ("platform", "expected"),
    [
        ({"os": "linux", "architecture": "amd64"}, ["linux/amd64"]),
        ({"os": "linux", "architecture": "arm64", "variant": "v8"}, ["linux/arm64"]),
        ({"os": "linux", "architecture": "arm", "variant": "v7"}, ["linux/arm/v7"]),
        ({"os": "unknown", "architecture": "unknown"}, []),  # an attestation manifest
    ],
)
def test_index_platforms(platform: dict[str, str], expected: list[str]) -> None:
    index = {"manifests": [{"digest": DIGEST, "platform": platform}]}
    assert [name for name, _ in platforms_of(index)] == expected


def _drivers(*texts: str) -> tuple[DriverVersion, ...]:
    return tuple(map(DriverVersion.parse, texts))


def _row(tag: str, **fields: Any) -> OverlayRow:
    return OverlayRow(PYTORCH, "pytorch", tag, DIGEST, ("linux/amd64", "linux/arm64"), **fields)


def test_merge_adds_a_new_tag_with_evidence_image(matrix: Matrix) -> None:
    merged = merge(matrix, [_row("26.11-py3", release="26.11", cuda="13.4.3")])
    row = next(r for r in merged.images if r.tag == "26.11-py3")
    assert (row.evidence, row.source) == ("image", f"image {PYTORCH}@{DIGEST}")
    assert overlay.origin(row) == "image"
    assert "linux/arm64" in row.note
    assert merged.images_for("pytorch")[0] is row  # the newest release sorts first
    assert merged.version != matrix.version
    assert all(r.source for r in merged.images)  # every row names where it came from


def test_the_overlay_lives_where_platformdirs_puts_user_data(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import platformdirs

    monkeypatch.delenv("GPUENV_DATA_DIR", raising=False)
    for base in (str(tmp_path), "relative/is/ignored", ""):
        monkeypatch.setenv("XDG_DATA_HOME", base)
        expected = os.path.join(
            platformdirs.user_data_dir("gpuenv", appauthor=False), "matrix-overlay.yaml"
        )
        assert overlay.overlay_path() == expected


def _unknown_cudnn(matrix: Matrix) -> Matrix:
    """The shipped matrix with PyTorch 25.10's cuDNN not recorded (as it was before the
    data was corrected): a field for the sync to fill."""
    import dataclasses

    images = tuple(
        dataclasses.replace(r, cudnn=None) if (r.repository, r.tag) == (PYTORCH, "25.10-py3") else r
        for r in matrix.images
    )
    return dataclasses.replace(matrix, images=images)


def test_merge_fills_unknown_fields_and_never_overwrites(matrix: Matrix) -> None:
    matrix = _unknown_cudnn(matrix)
    shipped = next(r for r in matrix.images if r.tag == "25.10-py3" and r.repository == PYTORCH)
    assert shipped.cudnn is None
    found = _row("25.10-py3", cuda="13.0.2", cudnn="9.14.0.64", ubuntu="24.04")
    merged = merge(matrix, [found])
    row = next(r for r in merged.images if r.tag == "25.10-py3" and r.repository == PYTORCH)
    assert row.cudnn == "9.14.0.64"
    assert row.cuda == shipped.cuda
    assert "ubuntu" not in row.unverified  # the image confirms it
    assert overlay.origin(row) == "shipped + image"
    assert disagreements(merged, [found]) == []


def test_a_disagreement_is_reported_and_the_shipped_value_kept(matrix: Matrix) -> None:
    found = _row("25.10-py3", cuda="13.0.1", framework_version="2.9.0a0+145a3a7")
    merged = merge(matrix, [found])
    row = next(r for r in merged.images if r.tag == "25.10-py3" and r.repository == PYTORCH)
    assert row.cuda == "13.0.2"
    (conflict,) = disagreements(merged, [found])
    assert (conflict.field, conflict.shipped, conflict.from_image) == ("cuda", "13.0.2", "13.0.1")
    assert "the matrix value is kept" in str(conflict)


def test_forward_compat_the_image_states_is_compared_by_branch(matrix: Matrix) -> None:
    shipped = next(r for r in matrix.images if r.framework == "none" and not r.forward_compat)
    found = OverlayRow(
        shipped.repository, "none", shipped.tag, DIGEST, (), forward_compat=_drivers("535", "550")
    )
    (conflict,) = disagreements(merge(matrix, [found]), [found])
    assert (conflict.field, conflict.shipped, conflict.from_image) == (
        "forward_compat",
        "none",
        "R535, R550",
    )


class FakeRegistry:
    """A registry of one multi-platform image and one plain one, counting reads."""

    def __init__(self) -> None:
        self.configs = {
            "25.10-py3": _config(ENV_25_10, UBUNTU),
            "26.11-py3": _config(
                ["CUDA_VERSION=13.4.3.001", "PYTORCH_BUILD_VERSION=2.15.0a0+standin"]
            ),
            "24.05-py3": _config(["NVIDIA_VISIBLE_DEVICES=all"]),
        }
        self.blobs = {}
        for config in self.configs.values():
            data = json.dumps(config).encode()
            self.blobs["sha256:" + hashlib.sha256(data).hexdigest()] = config
        self.reads: list[str] = []

    def _config_digest(self, tag: str) -> str:
        return "sha256:" + hashlib.sha256(json.dumps(self.configs[tag]).encode()).hexdigest()

    def tags(self, repository: str) -> list[str]:
        if repository != "nvidia/pytorch":
            raise UnknownRepository(f"no {repository}")
        return ["25.10-py3", "26.11-py3", "24.05-py3", "latest", "25.10-py3-igpu"]

    def manifest(self, repository: str, reference: str) -> Manifest:
        self.reads.append(reference)
        if reference == "25.10-py3":
            index = {
                "manifests": [
                    {"digest": "sha256:arm", "platform": {"os": "linux", "architecture": "arm64"}},
                    {"digest": "sha256:amd", "platform": {"os": "linux", "architecture": "amd64"}},
                ]
            }
            return Manifest("application/vnd.oci.image.index.v1+json", "sha256:" + "1" * 64, index)
        tag = "25.10-py3" if reference in ("sha256:amd", "sha256:arm") else reference
        document = {"config": {"digest": self._config_digest(tag)}}
        digest = "sha256:" + hashlib.sha256(reference.encode()).hexdigest()
        return Manifest("application/vnd.docker.distribution.manifest.v2+json", digest, document)

    def blob(self, repository: str, digest: str) -> dict[str, Any]:
        return self.blobs[digest]


def test_sync_reads_tags_shaped_like_the_matrix(matrix: Matrix) -> None:
    registry = FakeRegistry()
    seen: list[str] = []
    matrix = _unknown_cudnn(matrix)
    report = sync(
        registry,
        matrix,
        {PYTORCH: "pytorch", "nvcr.io/nvidia/jax": "jax"},
        progress=lambda done, total, image: seen.append(image),
    )
    assert "latest" not in registry.reads and "25.10-py3-igpu" not in registry.reads
    assert [r.tag for r in report.rows] == ["25.10-py3", "26.11-py3"]
    assert report.rows[0].platforms == ("linux/arm64", "linux/amd64")
    assert report.added == [f"{PYTORCH}:26.11-py3"]
    assert report.filled == {f"{PYTORCH}:25.10-py3": ["cudnn"]}
    assert "nvcr.io/nvidia/jax: not in the registry" in report.skipped
    assert f"{PYTORCH}:24.05-py3: no NGC metadata in its config" in report.skipped
    assert seen == [f"{PYTORCH}:{t}" for t in ("24.05-py3", "25.10-py3", "26.11-py3")]
    again = sync(registry, matrix, {PYTORCH: "pytorch"}, report.rows)
    assert (again.read, again.reused) == (1, 2)  # only the image without metadata again


def test_sync_matrix_rewrites_a_damaged_overlay_and_reads_again_only_what_changed() -> None:
    path = overlay.overlay_path()
    overlay.write(path, "images: [\n")
    said: dict[str, list[str]] = {"step": [], "warn": [], "progress": []}

    def run() -> Synced:
        return sync_matrix(
            SyncSource("127.0.0.1:5000", None, None),
            lambda _: FakeRegistry(),
            ["pytorch"],
            progress=lambda done, total, image: said["progress"].append(image),
            step=said["step"].append,
            warn=said["warn"].append,
        )

    report, written = run()
    assert written == path
    (warned,) = said["warn"]
    assert warned.startswith(f"the overlay {path} is damaged and is rewritten (")
    assert said["step"] == [f"reading {PYTORCH} from 127.0.0.1:5000"]
    assert said["progress"] == [f"{PYTORCH}:{t}" for t in ("24.05-py3", "25.10-py3", "26.11-py3")]
    assert overlay.parse_rows(Path(path).read_bytes(), path) == tuple(report.rows)
    assert "registry: 127.0.0.1:5000" in Path(path).read_text()
    again, _ = run()
    assert len(said["warn"]) == 1  # the rewritten overlay is read back, not warned of
    assert (again.read, again.reused) == (1, 2)


@pytest.mark.parametrize(
    ("registry", "env", "expected"),
    [
        ("http://127.0.0.1:5000", {}, SyncSource("127.0.0.1:5000", "http", None)),
        ("mirror.example:5000/", {}, SyncSource("mirror.example:5000", None, None)),
        (None, {"GPUENV_REGISTRY_MIRROR": "m.example"}, SyncSource("m.example", None, None)),
        (
            None,
            {"NGC_API_KEY": "key"},
            SyncSource(
                "nvcr.io",
                None,
                {"username": "$oauthtoken", "password": "key", "serveraddress": "nvcr.io"},
            ),
        ),
    ],
)
def test_sync_source_is_the_registry_asked_for_else_the_mirror_else_nvcr(
    monkeypatch: pytest.MonkeyPatch,
    registry: str | None,
    env: dict[str, str],
    expected: SyncSource,
) -> None:
    monkeypatch.delenv("GPUENV_REGISTRY_MIRROR", raising=False)
    monkeypatch.delenv("NGC_API_KEY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert SyncSource.for_registry(registry) == expected


def test_sync_source_refuses_a_registry_that_is_no_host(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="'bad host!' is not a registry mirror"):
        SyncSource.for_registry("bad host!")
    monkeypatch.setenv("GPUENV_REGISTRY_MIRROR", "bad mirror")
    with pytest.raises(ValueError, match="'bad mirror' is not a registry mirror"):
        SyncSource.for_registry(None)


def test_the_overlay_round_trips_and_joins_the_matrix(tmp_path: Path, matrix: Matrix) -> None:
    path = overlay.overlay_path()
    assert path.startswith(os.environ["GPUENV_DATA_DIR"])
    rows = [_row("26.11-py3", release="26.11", cuda="13.4.3", forward_compat=_drivers("580"))]
    overlay.write(path, overlay.overlay_text("127.0.0.1:5000", "2026-12-01T00:00:00Z", rows))
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert overlay.parse_rows(Path(path).read_bytes(), path) == tuple(rows)
    loaded = load_matrix()
    assert any(r.tag == "26.11-py3" and r.evidence == "image" for r in loaded.images)
    assert not any(r.tag == "26.11-py3" for r in load_matrix(with_overlay=False).images)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("schema: 1\nkind: image-overlay\nimages:\n  - {tag: 1}\n", "images[0].repository"),
        (
            "schema: 1\nkind: image-overlay\nimages:\n"
            f"  - {{repository: {PYTORCH}, framework: pytorch, tag: 26.11-py3, "
            f"digest: '{DIGEST}', platforms: [], cuda: 13.4}}\n",
            ":4:",
        ),
        ("images: [\n", "matrix-overlay.yaml"),
        ("schema: 2\nkind: image-overlay\nimages: []\n", "kind: image-overlay"),
    ],
)
def test_a_damaged_overlay_is_a_located_matrix_error(text: str, message: str) -> None:
    path = overlay.overlay_path()
    overlay.write(path, text)
    with pytest.raises(MatrixError) as raised:
        load_matrix()
    assert message in str(raised.value) + "".join(str(p) for p in raised.value.problems)
    assert "gpuenv matrix sync" in (raised.value.hint or "")
    result = CliRunner().invoke(main, ["check"])
    assert result.exit_code == 6
    assert "matrix-overlay.yaml" in result.output


def test_matrix_shows_where_rows_came_from(matrix: Matrix) -> None:
    rows = [_row("26.11-py3", release="26.11"), _row("25.10-py3", cuda="13.0.1")]
    overlay.write(overlay.overlay_path(), overlay.overlay_text("r", "now", rows))
    text = CliRunner().invoke(main, ["matrix"]).stdout
    assert "image rows:" in text and "1 image" in text
    assert "disagrees: nvcr.io/nvidia/pytorch:25.10-py3: cuda is 13.0.2" in text
    data = json.loads(CliRunner().invoke(main, ["matrix", "--json"]).stdout)
    assert data["origins"]["image"] == 1 and len(data["disagreements"]) == 1
    table = json.loads(CliRunner().invoke(main, ["matrix", "pytorch", "--json"]).stdout)
    assert table[0]["tag"] == "26.11-py3" and table[0]["origin"] == "image"
