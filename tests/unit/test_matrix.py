from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuenv.common.versions import is_version
from gpuenv.errors import MatrixError
from gpuenv.matrix.load import Matrix, load_matrix

from ..conftest import MATRICES


def test_shipped_matrices_load(matrix: Matrix) -> None:
    assert matrix.version.startswith("20")
    assert {"pytorch", "tensorflow", "jax", "none"} <= set(matrix.frameworks())


def test_pytorch_covers_22_01_to_26_10(matrix: Matrix) -> None:
    releases = {row.release for row in matrix.images_for("pytorch")}
    expected = {f"{y}.{m:02d}" for y in range(22, 27) for m in range(1, 13)}
    expected = {r for r in expected if "22.01" <= r <= "26.10"} - {"25.07"}
    assert releases == expected  # 25.07 has no PyTorch container


def test_images_are_newest_first(matrix: Matrix) -> None:
    releases = [row.release for row in matrix.images_for("pytorch")]
    assert releases == sorted(releases, reverse=True)


@pytest.mark.parametrize(
    ("tag", "framework_version", "cuda", "min_driver"),
    [
        ("24.05-py3", "2.4.0a0+07cecf4168", "12.4.1", "545"),
        ("23.10-py3", "2.1.0a0+32f93b1", "12.2.2", "535"),
        # NVIDIA says 560 (Triton rel-25-01), inside CUDA 12 minor-version compatibility (>= 525)
        ("25.01-py3", "2.6.0a0+ecf3bae40a", "12.8.0", "560"),
        ("25.08-py3", "2.8.0a0+34c6371d24", "13.0.0", "580"),  # CUDA 13 floor, not "575"
    ],
)
def test_known_rows(
    matrix: Matrix, tag: str, framework_version: str, cuda: str, min_driver: str
) -> None:
    row = next(r for r in matrix.images_for("pytorch") if r.tag == tag)
    assert (row.framework_version, row.cuda, str(row.min_driver)) == (
        framework_version,
        cuda,
        min_driver,
    )


def test_rows_are_consistent(matrix: Matrix) -> None:
    for row in matrix.images:
        assert row.evidence in ("primary", "secondary", "unverified")
        for value in (row.framework_version, row.cuda, row.python, row.ubuntu):
            assert value is None or is_version(value)
        if row.cuda and row.min_driver and row.framework != "none":
            floor = matrix.minor_compat_floor(row.cuda)
            assert floor is not None
            # Every stated minimum ("525+") is on or above the CUDA major's floor branch.
            assert row.min_driver.branch >= floor.branch, row.tag
        if row.evidence == "primary":
            assert not {"framework_version", "cuda"} & set(row.unverified), row.tag


@pytest.mark.parametrize(
    ("name", "model", "cc", "gpu_class"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100", "8.0", "datacenter"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090", "8.9", "consumer"),
        ("Tesla V100-SXM2-32GB", "V100", "7.0", "datacenter"),
        ("NVIDIA H100 80GB HBM3", "H100", "9.0", "datacenter"),
        ("NVIDIA H200", "H200", "9.0", "datacenter"),
        ("A100", "A100", "8.0", "datacenter"),
        ("RTX 4090", "RTX 4090", "8.9", "consumer"),
        ("rtx 5090", "RTX 5090", "12.0", "consumer"),
        ("NVIDIA GeForce RTX 5090", "RTX 5090", "12.0", "consumer"),
        ("Tesla T4", "T4", "7.5", "datacenter"),
        ("NVIDIA L40S", "L40S", "8.9", "datacenter"),
        ("NVIDIA L40", "L40", "8.9", "datacenter"),
        ("NVIDIA RTX A6000", "RTX A6000", "8.6", "workstation"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada", "8.9", "workstation"),
        ("Quadro RTX 6000", "Quadro RTX 6000", "7.5", "workstation"),
        ("NVIDIA B200", "B200", "10.0", "datacenter"),
        ("NVIDIA A10G", "A10G", "8.6", "datacenter"),
        ("NVIDIA A10", "A10", "8.6", "datacenter"),
        ("NVIDIA A2", "A2", "8.6", "datacenter"),
    ],
)
def test_gpu_names(matrix: Matrix, name: str, model: str, cc: str, gpu_class: str) -> None:
    found = matrix.find_gpu(name)
    assert found is not None
    assert (found.name, str(found.compute_capability), found.gpu_class) == (model, cc, gpu_class)


@pytest.mark.parametrize("name", ["NVIDIA Graphics Device", "Radeon RX 7900", "RTX", ""])
def test_unknown_gpu_names(matrix: Matrix, name: str) -> None:
    assert matrix.find_gpu(name) is None


@pytest.mark.parametrize(
    ("cuda", "label"),
    [
        ("12.4.1", "12.4 Update 1"),
        ("12.8.0", "12.8 GA"),
        ("12.3.2", "12.3 Update 2"),  # listed since the audit (matrix-audit 3)
        ("13.4.3", "13.4 GA"),  # NGC 26.10's CUDA, not listed: nearest lower update
        ("11.8", "11.8 GA"),
    ],
)
def test_toolkit_lookup(matrix: Matrix, cuda: str, label: str) -> None:
    toolkit = matrix.toolkit(cuda)
    assert toolkit is not None and toolkit.label == label


def _copy(tmp_path: Path) -> Path:
    target = tmp_path / "matrices"
    shutil.copytree(MATRICES, target)
    return target


def test_broken_matrix_is_located(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    path = folder / "ngc-pytorch.yaml"
    text = path.read_text()
    text = text.replace('cuda: "12.4.1"', "cuda: 12.4", 1).replace(
        'min_driver: "545"', 'min_driver: "five"', 1
    )
    path.write_text(text)
    with pytest.raises(MatrixError) as info:
        load_matrix(str(folder))
    messages = [str(p) for p in info.value.problems]
    assert any(
        "ngc-pytorch.yaml:" in m
        and "expected a version, got the number 12.4 (write it in quotes)" in m
        for m in messages
    )
    assert any("'five' is not a driver version" in m for m in messages)


def test_unknown_schema(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    path = folder / "gpus.yaml"
    path.write_text(path.read_text().replace("schema: 1", "schema: 99", 1))
    with pytest.raises(MatrixError, match="schema 99 is not supported"):
        load_matrix(str(folder))


def test_duplicate_tags_and_missing_fields(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    for name in ("cuda.yaml", "gpus.yaml"):
        shutil.copy(Path(MATRICES) / name, folder / name)
    (folder / "x.yaml").write_text(
        "schema: 1\nkind: framework-images\nframework: pytorch\nfamily: ngc\n"
        'repository: r\nupdated: "2026-01-01"\nimages:\n'
        '  - {tag: a, release: "24.01", framework_version: "2.2", cuda: "12.3", cudnn: null,'
        ' python: "3.10", ubuntu: null, min_driver: "545", forward_compat: [],'
        " min_compute_capability: null, evidence: primary, unverified: [], note: null}\n"
        '  - {tag: a, release: "24.13x"}\n'
    )
    with pytest.raises(MatrixError) as info:
        load_matrix(str(folder))
    text = str(info.value)
    assert "x.yaml:9" in text and "tag 'a' is listed twice" in text
    assert "missing field 'cuda' (write null when unknown)" in text
    assert "is not an NGC release (YY.MM)" in text


def test_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(MatrixError, match=r"no matrix files \(\*\.yaml\) found"):
        load_matrix(str(tmp_path))


def test_matrix_dir_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUENV_MATRIX_DIR", str(_copy(tmp_path)))
    assert load_matrix().directory == str(tmp_path / "matrices")
