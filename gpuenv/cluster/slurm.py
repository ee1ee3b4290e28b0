"""The locked environment on other schedulers: Slurm batch scripts (docker or pyxis),
Kubernetes Jobs and Compose services. Rendering only: values are quoted for the shell
(shlex) or serialized as YAML data, never pasted raw."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import string
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpuenv.common.platforms import UNAME, arch_of
from gpuenv.common.resources import data_dir
from gpuenv.errors import UsageError
from gpuenv.project.spec import WORKSPACE, Spec

if TYPE_CHECKING:
    from gpuenv.project.mounts import Bind

_DNS = re.compile(r"[^a-z0-9-]+")


class _Template(string.Template):
    delimiter = "@"


def _template(name: str) -> _Template:
    with open(os.path.join(data_dir("images"), "cluster", name), encoding="utf-8") as handle:
        return _Template(handle.read())


def pushed_image(extra: Mapping[str, Any]) -> str:
    """The image by pushed digest, as `gpuenv push` recorded it in the lock."""
    pushed = extra.get("pushed") or {}
    image = pushed.get("image") if isinstance(pushed, dict) else None
    if not isinstance(image, str) or "@sha256:" not in image:
        raise UsageError(
            "the project image has not been pushed: clusters pull it by digest",
            hint="run `gpuenv push REGISTRY/REPO` first (it builds with the code baked in)",
        )
    return image


def job_name(spec: Spec) -> str:
    return f"gpuenv-{spec.name}"


def _directives(
    spec: Spec,
    gpus: int,
    output_dir: str,
    time_limit: str | None,
    partition: str | None,
    nodes: int | None,
    extra: Sequence[str],
) -> str:
    lines = [f"--job-name={job_name(spec)}"]
    if gpus:
        lines.append(f"--gres=gpu:{gpus}")
    lines += [f"--output={output_dir}/%x-%j.out", f"--error={output_dir}/%x-%j.err"]
    if time_limit:
        lines.append(f"--time={time_limit}")
    if partition:
        lines.append(f"--partition={partition}")
    if nodes:
        lines.append(f"--nodes={nodes}")
    for argument in extra:
        if not argument.startswith("--") or any(ch in argument for ch in "\n\r"):
            raise UsageError(f"--sbatch-arg {argument!r}: expected one option like --mem=64G")
        lines.append(argument)
    for line in lines:
        if any(ch in line for ch in "\n\r"):
            raise UsageError(f"{line!r} cannot go into an #SBATCH line")
    return "\n".join(f"#SBATCH {line}" for line in lines)


def sbatch_script(
    spec: Spec,
    image: str,
    command: Sequence[str],
    env: Mapping[str, str],
    *,
    passthrough: Sequence[str] = (),
    gpus: int,
    output_dir: str,
    shm_size: int,
    launcher: str = "docker",
    time_limit: str | None = None,
    partition: str | None = None,
    nodes: int | None = None,
    extra: Sequence[str] = (),
    platform: str | None = None,
) -> str:
    """The sbatch script: its step runs `image` with exactly the GPUs Slurm granted, and
    first checks that the node is of the image's platform (when known)."""
    check = _platform_check(platform)
    project_dir = spec.project_dir
    if "," in project_dir or ":" in project_dir:
        raise UsageError(
            f"the project folder {project_dir} has ',' or ':', which mounts cannot carry"
        )
    directives = _directives(spec, gpus, output_dir, time_limit, partition, nodes, extra)
    quoted = " ".join(shlex.quote(part) for part in command)
    if launcher == "pyxis":
        registry, _, rest = image.partition("/")
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
        return _template("pyxis.sh.in").substitute(
            project=shlex.quote(spec.name),
            directives=directives,
            platform_check=check,
            image=shlex.quote(f"{registry}#{rest}"),
            mounts=shlex.quote(f"{project_dir}:{WORKSPACE}"),
            exports=exports,
            command=quoted,
        )
    # The spec's values are written (gpuenv.yaml has them already); every -e and
    # --env-file variable is only named: its value travels in the job's environment
    # (sbatch exports the environment it was started with), never in the script.
    env_args = "".join(f" -e {shlex.quote(f'{k}={v}')}" for k, v in env.items())
    env_args += "".join(f" -e {shlex.quote(k)}" for k in passthrough)
    return _template("sbatch.sh.in").substitute(
        project=shlex.quote(spec.name),
        directives=directives,
        platform_check=check,
        image=shlex.quote(image),
        mount=shlex.quote(f"type=bind,source={project_dir},target={WORKSPACE}"),
        shm_size=str(shm_size),
        env=env_args,
        command=quoted,
    )


def _platform_check(platform: str | None) -> str:
    """Shell lines that end the job with a clear message on a node of another platform
    (an amd64 image on a GH200 node fails with "exec format error" otherwise)."""
    if not platform:
        return ""
    machine = UNAME[platform]
    return (
        f'if [ "$(uname -m)" != {machine} ]; then\n'
        f'  echo "gpuenv: the image is built for {platform}; this node is $(uname -m):'
        ' submit to a partition of that platform, or push an image built for it" >&2\n'
        "  exit 1\n"
        "fi\n"
    )


def _dns_name(text: str, suffix: str) -> str:
    base = _DNS.sub("-", text.lower()).strip("-")[: 63 - len(suffix) - 1].strip("-") or "job"
    return f"{base}-{suffix}"


def kubernetes_job(
    spec: Spec,
    image: str,
    command: Sequence[str],
    env: Mapping[str, str],
    *,
    gpus: int,
    shm_size: int,
    uid: int,
    gid: int,
    platform: str | None = None,
) -> dict[str, Any]:
    """A batch/v1 Job: the image by digest, GPUs as nvidia.com/gpu, /dev/shm sized from the
    spec, a non-root user, Never restarted, no retries; on nodes of the image's platform
    (kubernetes.io/arch) when it is known."""
    suffix = hashlib.sha256(json.dumps([image, list(command)]).encode()).hexdigest()[:8]
    labels = {"app.kubernetes.io/managed-by": "gpuenv", "io.gpuenv/project": spec.name}
    user = uid if uid != 0 else 1000
    group = gid if uid != 0 else 1000
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "command": list(command),
        "workingDir": WORKSPACE,
        "env": [
            {"name": k, "value": v} for k, v in {**env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}.items()
        ],
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    shm = f"{shm_size // 2**20}Mi"
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": {
            "runAsUser": user,
            "runAsGroup": group,
            "runAsNonRoot": True,
            "fsGroup": group,
        },
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}}],
    }
    if platform:
        pod["nodeSelector"] = {"kubernetes.io/arch": arch_of(platform)}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": _dns_name(job_name(spec), suffix), "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
        },
    }


def compose_file(
    spec: Spec,
    image: str,
    command: Sequence[str],
    env: Mapping[str, str],
    *,
    gpus: int | None,
    device_ids: Sequence[str],
    shm_size: int,
    uid: int,
    gid: int,
    platform: str | None = None,
    binds: Sequence[Bind] = (),
) -> dict[str, Any]:
    """A Compose service; the GPU reservation names a count or device ids, never neither
    (since Engine 27.3 that means no GPU at all); the image's platform when known.
    `binds`: the spec's mounts as gpuenv.project.mounts decided them (as for a run)."""
    service: dict[str, Any] = {
        "image": image,
        "command": list(command),
        "working_dir": WORKSPACE,
        "volumes": [f"{spec.project_dir}:{WORKSPACE}"]
        + [f"{b.source}:{b.target}{':ro' if b.read_only else ''}" for b in binds],
        "environment": {**env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        "shm_size": str(shm_size),
        "init": True,
    }
    if uid != 0:
        service["user"] = f"{uid}:{gid}"
    if platform:
        service["platform"] = platform
    if gpus or device_ids:
        device: dict[str, Any] = {"driver": "nvidia", "capabilities": ["gpu"]}
        if device_ids:
            device["device_ids"] = list(device_ids)
        else:
            device["count"] = gpus
        service["deploy"] = {"resources": {"reservations": {"devices": [device]}}}
    return {"services": {spec.name: service}}
