"""The pushed image as each launcher names it: Docker's `REGISTRY/REPO@sha256:…`,
enroot's `REGISTRY#REPO:sha256:…` (which pyxis prepends `docker://` to), Apptainer's
`docker://REGISTRY/REPO@sha256:…` and its SIF file in a cache keyed by the digest."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuenv.errors import UsageError

# enroot's parser of `docker://[USER@][REGISTRY#]IMAGE[:TAG]` (NVIDIA/enroot src/docker.sh,
# docker::import, the same from v3.0.1, commit 0a48a03 "Allow specifiying digests in
# Docker tags", to v3.5.0): an image of lower-case letters, digits and `/._-`, a tag of
# letters, digits and `._:-`. No `@` anywhere, so `REPO@sha256:…` is "Invalid image
# reference" on every 3.x; the digest goes where the tag goes, `REPO:sha256:…`, which
# the manifest URL (`/v2/IMAGE/manifests/TAG`) then asks for by digest. enroot 4.x
# (docker::_parse_uri, commit f29a45c) also takes Docker's forms, and `REGISTRY#IMAGE:TAG`
# still, so this one form works on both.
ENROOT_3 = re.compile(
    r"^docker://((?P<user>[A-Za-z0-9_.!~*'()%;:&=+$,-@]+)@)?((?P<registry>[^#]+)#)?"
    r"(?P<image>[a-z0-9/._-]+)(:(?P<tag>[A-Za-z0-9._:-]+))?$"
)
ENROOT_4_REGISTRY = re.compile(
    r"^docker://((?P<user>[A-Za-z0-9_.!~*'()%;:&=+$,-@]+)@)?(?P<registry>[^#/@]+)#"
    r"(?P<image>[a-z0-9/._-]+)(:(?P<tag>[A-Za-z0-9._:-]+))?$"
)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# Docker Hub's names (enroot 3.x sends requests to the registry named, as it is named).
_DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io")


@dataclass(frozen=True)
class PinnedImage:
    """`REGISTRY/REPO@sha256:HEX`, split: what every launcher's name is made from."""

    registry: str
    repository: str
    digest: str

    @classmethod
    def parse(cls, image: str) -> PinnedImage:
        """
        >>> PinnedImage.parse("127.0.0.1:5000/team/demo@sha256:" + "ab" * 32).registry
        '127.0.0.1:5000'
        """
        name, _, digest = image.partition("@")
        first, _, rest = name.partition("/")
        if not _DIGEST.match(digest) or not rest:
            raise UsageError(
                f"the pushed image {image!r} is not REGISTRY/REPO@sha256:…",
                hint="run `gpuenv push REGISTRY/REPO` again",
            )
        if ":" in rest.rsplit("/", 1)[-1]:
            rest = rest.rsplit(":", 1)[0]  # REPO:TAG@sha256: the digest decides
        if "." not in first and ":" not in first and first != "localhost":
            first, rest = "registry-1.docker.io", name  # Docker Hub: user/repo
        if first in _DOCKER_HUB:
            first = "registry-1.docker.io"
            rest = rest if "/" in rest else f"library/{rest}"
        return cls(first, rest, digest)

    @property
    def docker(self) -> str:
        return f"{self.registry}/{self.repository}@{self.digest}"

    @property
    def enroot(self) -> str:
        """What `srun --container-image=` takes: pyxis prepends `docker://`.

        >>> PinnedImage("127.0.0.1:5000", "team/demo", "sha256:" + "0" * 64).enroot[:30]
        '127.0.0.1:5000#team/demo:sha25'
        """
        uri = f"{self.registry}#{self.repository}:{self.digest}"
        check_enroot_uri(f"docker://{uri}", self.digest)
        return uri

    @property
    def apptainer(self) -> str:
        return f"docker://{self.docker}"

    @property
    def sif_name(self) -> str:
        """The cache's file name: the digest alone, since a SIF does not record it
        (apptainer#2764) and the same digest is the same image from any repository."""
        return self.digest.replace(":", "-") + ".sif"

    @property
    def insecure(self) -> bool:
        """Registries on loopback, which Docker also reaches over plain HTTP."""
        host = self.registry.rsplit(":", 1)[0] if ":" in self.registry else self.registry
        return host == "localhost" or host.startswith("127.")


def check_enroot_uri(uri: str, digest: str) -> None:
    """Refuse a URI that enroot 3.x or 4.x would not parse as REGISTRY, IMAGE and the
    digest as its tag."""
    for grammar in (ENROOT_3, ENROOT_4_REGISTRY):
        match = grammar.match(uri)
        if not match or match.group("tag") != digest or not match.group("registry"):
            raise UsageError(
                f"{uri} is not an image reference enroot parses "
                "(docker://[USER@][REGISTRY#]IMAGE[:TAG], IMAGE in lower case)",
                hint="push to a repository whose name is lower case: `gpuenv push REGISTRY/repo`",
            )
