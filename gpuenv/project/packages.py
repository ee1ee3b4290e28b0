"""What gpuenv knows about Python packages on top of an NGC image: which ones are the
framework, which ones NVIDIA builds against it, which ones compile against it, which ones
imply a framework, and what a conda package is called on PyPI.

Pure data and small lookups; every table names where its facts come from.
"""

from __future__ import annotations

import re

from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.version import InvalidVersion, Version

# The framework distributions themselves (a direct pin names the framework).
FRAMEWORK_PACKAGES = {
    "torch": "pytorch",
    "pytorch": "pytorch",  # conda's name
    "jax": "jax",
    "jaxlib": "jax",
    "tensorflow": "tensorflow",
    "tensorflow-gpu": "tensorflow",
    "tensorflow-cpu": "tensorflow",
    "tensorflow-intel": "tensorflow",
    "tf-nightly": "tensorflow",
}

# Packages that need one framework and only that one (their own install requirements or
# documentation say so), so a project that names only them needs that framework:
# tf-keras is Keras 2 for TensorFlow; flax, optax, chex, dm-haiku, equinox and orbax are
# JAX libraries; torchvision/torchaudio, lightning, accelerate, peft, timm, deepspeed,
# flash-attn... declare torch. Multi-backend libraries (transformers, diffusers, keras 3)
# are deliberately absent: they imply nothing.
IMPLIES = {
    "tf-keras": "tensorflow",
    "tensorflow-text": "tensorflow",
    "tensorflow-hub": "tensorflow",
    "tensorflow-model-optimization": "tensorflow",
    "tensorflow-addons": "tensorflow",
    "tensorflow-probability": "tensorflow",
    "tf-models-official": "tensorflow",
    "tf-slim": "tensorflow",
    "flax": "jax",
    "optax": "jax",
    "chex": "jax",
    "dm-haiku": "jax",
    "equinox": "jax",
    "orbax-checkpoint": "jax",
    "jraph": "jax",
    "torchvision": "pytorch",
    "torchaudio": "pytorch",
    "torchtext": "pytorch",
    "torchdata": "pytorch",
    "torchmetrics": "pytorch",
    "pytorch-lightning": "pytorch",
    "lightning": "pytorch",
    "accelerate": "pytorch",
    "peft": "pytorch",
    "timm": "pytorch",
    "deepspeed": "pytorch",
    "flash-attn": "pytorch",
    "xformers": "pytorch",
    "mamba-ssm": "pytorch",
    "apex": "pytorch",
    "bitsandbytes": "pytorch",
    "sentence-transformers": "pytorch",
    "kornia": "pytorch",
    "torch-fidelity": "pytorch",
}

# Packages built together with torch: a PyPI copy of another build breaks NVIDIA's torch
# (a different CUDA, a different C++ ABI). NGC PyTorch images carry NVIDIA's builds of
# torch and torchvision (and, in many releases, more: the matrix row's `ships` says which,
# where known); the build step reads the image itself for the rest.
COUPLED = {
    "pytorch": ("torch", "torchvision", "torchaudio", "torchtext", "triton"),
    "tensorflow": ("tensorflow", "tensorflow-gpu", "tensorflow-cpu", "tf-nightly"),
    "jax": ("jax", "jaxlib"),
}

FRAMEWORK_OR_COUPLED = frozenset(FRAMEWORK_PACKAGES) | {n for v in COUPLED.values() for n in v}

# torch series -> the torchvision and torchaudio series released with it (PyTorch's
# previous-versions page and RELEASE.md, shared/reference/compat-facts.md table E).
# Unknown pairs (2.12 and later at the time of writing) are absent: never guessed.
COMPANIONS: dict[str, dict[str, str]] = {
    "1.13": {"torchvision": "0.14", "torchaudio": "0.13"},
    "2.0": {"torchvision": "0.15", "torchaudio": "2.0"},
    "2.1": {"torchvision": "0.16", "torchaudio": "2.1"},
    "2.2": {"torchvision": "0.17", "torchaudio": "2.2"},
    "2.3": {"torchvision": "0.18", "torchaudio": "2.3"},
    "2.4": {"torchvision": "0.19", "torchaudio": "2.4"},
    "2.5": {"torchvision": "0.20", "torchaudio": "2.5"},
    "2.6": {"torchvision": "0.21", "torchaudio": "2.6"},
    "2.7": {"torchvision": "0.22", "torchaudio": "2.7"},
    "2.8": {"torchvision": "0.23", "torchaudio": "2.8"},
    "2.9": {"torchvision": "0.24", "torchaudio": "2.9"},
    "2.10": {"torchvision": "0.25", "torchaudio": "2.10"},
    "2.11": {"torchvision": "0.26", "torchaudio": "2.11"},
}

# Packages whose build imports torch (setup.py `import torch`, CUDA extensions compiled
# against the installed torch): pip's build isolation hides the image's torch from them,
# so they fail (or build against a PyPI torch). gpuenv installs them after everything
# else with --no-build-isolation. Sources: each project's install notes (flash-attn:
# "pip install flash-attn --no-build-isolation"; mamba-ssm and causal-conv1d the same;
# Megatron-LM's [tool.uv] no-build-isolation-package list; apex, deepspeed ops).
COMPILES_AGAINST_TORCH = frozenset(
    {
        "flash-attn",
        "apex",
        "deepspeed",
        "mamba-ssm",
        "causal-conv1d",
        "transformer-engine",
        "transformer-engine-torch",
        "fast-hadamard-transform",
        "flash-mla",
        "deep-gemm",
        "grouped-gemm",
        "natten",
        "torch-scatter",
        "torch-sparse",
        "torch-cluster",
        "pytorch3d",
        "nvdiffrast",
    }
)

# Framework wheel indexes: they serve torch (or jax) builds for one CUDA (or none), never
# NVIDIA's. Lines pointing at them are reported and not used.
_FRAMEWORK_INDEX = re.compile(
    r"^https?://(download\.pytorch\.org/whl(/|$)|storage\.googleapis\.com/jax-releases/)",
    re.IGNORECASE,
)

# conda package -> its PyPI name, where it has one; None: the NGC image provides it
# (CUDA, cuDNN, NCCL, compilers) or it is conda's own machinery. Names absent here are
# reported without a pip equivalent.
CONDA_TO_PIP: dict[str, str | None] = {
    "pytorch": "torch",
    "torchvision": "torchvision",
    "torchaudio": "torchaudio",
    "pytorch-lightning": "pytorch-lightning",
    "lightning": "lightning",
    "tensorflow": "tensorflow",
    "tensorflow-gpu": "tensorflow",
    "jax": "jax",
    "jaxlib": "jaxlib",
    "numpy": "numpy",
    "scipy": "scipy",
    "pandas": "pandas",
    "scikit-learn": "scikit-learn",
    "matplotlib": "matplotlib",
    "pillow": "pillow",
    "opencv": "opencv-python",
    "py-opencv": "opencv-python",
    "pydantic": "pydantic",
    "py-cpuinfo": "py-cpuinfo",
    "ninja": "ninja",
    "certifi": "certifi",
    "tqdm": "tqdm",
    "pyyaml": "pyyaml",
    "requests": "requests",
    "transformers": "transformers",
    "cudatoolkit": None,
    "cuda": None,
    "cuda-toolkit": None,
    "cudnn": None,
    "nccl": None,
    "pytorch-cuda": None,
    "compilers": None,
    "gcc": None,
    "sysroot_linux-64": None,
    "libaio": None,
    "openssl": None,
    "ca-certificates": None,
    "pip": None,
    "python": None,
    "mkl": None,
}
CONDA_PROVIDED_BY_IMAGE = frozenset(
    {"cudatoolkit", "cuda", "cuda-toolkit", "cudnn", "nccl", "pytorch-cuda"}
)


_SEPARATORS = re.compile(r"[-_.]+")


def normalize(name: str) -> str:
    """PEP 503 normalized name: ``Flash_Attn`` -> ``flash-attn`` (packaging's
    canonicalize_name, whose module loads packaging.tags and logging, ~10 ms, for one
    regular expression; a test holds the two together).

    >>> normalize("Flash_Attn"), normalize("zope.interface"), normalize("A--B__c")
    ('flash-attn', 'zope-interface', 'a-b-c')
    """
    return _SEPARATORS.sub("-", name).lower()


def framework_index(url: str) -> bool:
    """Whether a package index or find-links URL serves framework builds.

    >>> framework_index("https://download.pytorch.org/whl/cu121")
    True
    >>> framework_index("https://pypi.example.com/simple")
    False
    """
    return bool(_FRAMEWORK_INDEX.match(url.strip()))


def series(version: str, parts: int = 2) -> str | None:
    """``2.5.0a0+e000cf0ad9`` -> ``2.5``; None when it is not a version."""
    try:
        release = Version(version).release
    except InvalidVersion:
        return None
    return ".".join(str(n) for n in release[:parts]) if len(release) >= parts else None


def companion_series(torch_version: str, package: str) -> str | None:
    """The series of `package` released with this torch, where known.

    >>> companion_series("2.5.0a0+e000cf0ad9", "torchvision")
    '0.20'
    >>> companion_series("2.14.0a0+4fdf77b940", "torchvision") is None
    True
    """
    torch_series = series(torch_version)
    if torch_series is None:
        return None
    return COMPANIONS.get(torch_series, {}).get(package)


def build_label(version: str) -> str | None:
    """The CUDA/CPU build label of a pin's local version (pytorch.org's ``+cu121``,
    ``+cpu``, ``+rocm6.0``): a build for another toolkit that the image's own build
    replaces; None for any other local version (an exact build).

    >>> build_label("2.3.1+cu121"), build_label("2.5.0a0+e000cf0"), build_label("2.3.1")
    ('cu121', None, None)
    """
    local = version.partition("+")[2].lower()
    return local if re.fullmatch(r"cu\d+|cpu|rocm[\d.]+|xpu", local) else None


def ngc_satisfies(specifier: str, shipped: str) -> bool:
    """Whether a version NVIDIA ships satisfies a project's specifier, in the NGC sense.

    NGC builds are development builds named after the next release of their series
    (``0.20.0a0+afc54f7`` in the month torchvision 0.20.1 is current), so an exact pin
    (``==0.20.1``) is satisfied by any such build of the same major.minor series; an
    exact pin against a release (``0.4.33``) is exact: ``==0.4.35`` is not it. A pin's
    CUDA build label (``==2.3.1+cu121``) is a build the image replaces: the pin is read
    as ``==2.3.1``. Any other specifier is checked against the release the build
    precedes (``0.20.0``). images/ngc/files/install.py keeps a standalone copy for the
    image's own Python; tests/unit/test_ngc_pins.py runs one table through both.

    >>> ngc_satisfies("==0.20.1", "0.20.0a0+afc54f7"), ngc_satisfies("==0.21.0", "0.20.0a0")
    (True, False)
    >>> ngc_satisfies("==0.4.35", "0.4.33"), ngc_satisfies("==2.3.1+cu121", "2.3.0a0+1767026")
    (False, True)
    >>> ngc_satisfies(">=2.5.1", "2.5.0a0+e000cf0ad9"), ngc_satisfies(">=2.4", "2.5.0a0")
    (False, True)
    >>> ngc_satisfies("", "2.5.0a0")
    True
    """
    try:
        build = Version(shipped)
        wanted = SpecifierSet(specifier)
    except (InvalidVersion, InvalidSpecifier):
        return False
    base = Version(build.base_version)
    for item in wanted:
        if item.operator in ("==", "===") and not item.version.endswith(".*"):
            try:
                pinned = Version(item.version)
            except InvalidVersion:
                return False
            if build_label(item.version):
                pinned = Version(pinned.public)
            if pinned.is_prerelease or pinned.local is not None:
                if not Specifier(f"=={pinned}").contains(build, prereleases=True):
                    return False
            elif build.is_prerelease or build.local is not None:
                if pinned.release[:2] != build.release[:2]:
                    return False
            elif Version(build.public) != pinned:
                return False
        elif not item.contains(base, prereleases=True):
            return False
    return True
