"""Slurm batch scripts for the locked environment: docker, pyxis/enroot or Apptainer, on
one node or, with torchrun, on several. Rendering only: values are quoted for the shell
(shlex), never pasted raw."""

from __future__ import annotations

import os
import re
import shlex
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuenv.cluster.images import PinnedImage
from gpuenv.common.platforms import UNAME
from gpuenv.common.resources import data_dir
from gpuenv.errors import UsageError
from gpuenv.project.spec import WORKSPACE, Spec


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
    launch: Launch,
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
    if launch.nodes:
        lines.append(f"--nodes={launch.nodes}")
    if launch.multi_node:
        lines.append("--ntasks-per-node=1")  # one torchrun per node; it starts the ranks
    for argument in extra:
        if not argument.startswith("--") or any(ch in argument for ch in "\n\r"):
            raise UsageError(f"--sbatch-arg {argument!r}: expected one option like --mem=64G")
        lines.append(argument)
    for line in lines:
        if any(ch in line for ch in "\n\r"):
            raise UsageError(f"{line!r} cannot go into an #SBATCH line")
    return "\n".join(f"#SBATCH {line}" for line in lines)


DEFAULT_RENDEZVOUS_TIMEOUT = 600  # torch's own default for the c10d join_timeout
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Launch:
    """How the job runs the image: the launcher, its nodes and the SIF cache."""

    launcher: str = "docker"
    nodes: int | None = None
    rendezvous_timeout: int = DEFAULT_RENDEZVOUS_TIMEOUT
    sif_cache: str = ""

    @property
    def multi_node(self) -> bool:
        return (self.nodes or 1) > 1


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
    launch: Launch = Launch(),
    time_limit: str | None = None,
    partition: str | None = None,
    extra: Sequence[str] = (),
    platform: str | None = None,
) -> str:
    """The sbatch script: its step runs `image` with exactly the GPUs Slurm granted, and
    first checks that the node is of the image's platform (when known). On several
    nodes, one torchrun per node joins a c10d rendezvous on the first node."""
    check = _platform_check(platform)
    project_dir = spec.project_dir
    _check_script_values(project_dir, passthrough)
    directives = _directives(spec, gpus, output_dir, time_limit, partition, launch, extra)
    quoted = " ".join(shlex.quote(part) for part in command)
    pinned = PinnedImage.parse(image)
    common = {"project": shlex.quote(spec.name), "directives": directives}
    if launch.launcher == "pyxis":
        return _pyxis(common, check, pinned, project_dir, env, quoted, launch)
    if launch.launcher == "apptainer":
        return _apptainer(common, check, pinned, project_dir, env, passthrough, quoted, launch)
    return _docker(common, check, image, project_dir, env, passthrough, quoted, shm_size, launch)


def _check_script_values(project_dir: str, passthrough: Sequence[str]) -> None:
    """UsageError for a project folder a mount cannot carry, or a -e name that is no
    variable name (both are written into the script)."""
    if "," in project_dir or ":" in project_dir:
        raise UsageError(
            f"the project folder {project_dir} has ',' or ':', which mounts cannot carry"
        )
    for name in passthrough:
        if not _NAME.match(name):
            raise UsageError(f"-e {name!r}: not a variable name")


def _docker(
    common: Mapping[str, str],
    check: str,
    image: str,
    project_dir: str,
    env: Mapping[str, str],
    passthrough: Sequence[str],
    command: str,
    shm_size: int,
    launch: Launch,
) -> str:
    """`docker run` on the granted GPUs: the sbatch template on one node; on several,
    one torchrun per node in the container."""
    # The spec's values are written (gpuenv.yaml has them already); every -e and
    # --env-file variable is only named: its value travels in the job's environment
    # (sbatch exports the environment it was started with), never in the script.
    env_args = "".join(f" -e {shlex.quote(f'{k}={v}')}" for k, v in env.items())
    env_args += "".join(f" -e {shlex.quote(k)}" for k in passthrough)
    mount = shlex.quote(f"type=bind,source={project_dir},target={WORKSPACE}")
    if launch.multi_node:
        run = (
            'docker run --rm --init --network host "${gpu_args[@]}" \\\n'
            '    --user "$(id -u):$(id -g)" \\\n'
            f"    --mount {mount} --workdir /workspace \\\n"
            f"    --shm-size {shm_size} --ulimit stack=67108864 \\\n"
            "    -e CUDA_DEVICE_ORDER=PCI_BUS_ID -e SLURM_JOB_ID -e SLURM_JOB_GPUS"
            f" -e NCCL_SOCKET_IFNAME -e GLOO_SOCKET_IFNAME{env_args} \\\n"
            f"    --label io.gpuenv.project={common['project']}"
            ' --label "io.gpuenv.slurm-job=${SLURM_JOB_ID:-}" \\\n'
            '    "$image"'
        )
        body = f"image={shlex.quote(image)}\nexport image\n"
        body += _torchrun(launch, _template("docker-step.sh.in").template, run, command)
        return _script("docker", common, check, body)
    return _template("sbatch.sh.in").substitute(
        **common,
        platform_check=check,
        image=shlex.quote(image),
        mount=mount,
        shm_size=str(shm_size),
        env=env_args,
        command=command,
    )


def _script(launcher: str, common: Mapping[str, str], check: str, body: str) -> str:
    """A multi-node script: the header of the launcher's, then `body`."""
    what = {"docker": "docker run", "apptainer": "Apptainer", "pyxis": "pyxis/enroot"}[launcher]
    return (
        "#!/bin/bash\n"
        f"# Written by `gpuenv submit --launcher {launcher}` for {common['project']}: one\n"
        f"# torchrun per node, each in the locked image ({what}), on the GPUs Slurm grants.\n"
        f"{common['directives']}\nset -euo pipefail\n{check}{body}"
    )


def _torchrun(launch: Launch, step: str, run: str, command: str) -> str:
    """The rendezvous lines and the function every node runs."""
    indented = "".join(f"  {line}\n" if line else "\n" for line in step.splitlines())
    return _template("torchrun.sh.in").substitute(
        nodes=str(launch.nodes),
        timeout=str(launch.rendezvous_timeout),
        step=indented.rstrip("\n"),
        launch=run,
        command=command,
    )


def _pyxis(
    common: Mapping[str, str],
    check: str,
    pinned: PinnedImage,
    project_dir: str,
    env: Mapping[str, str],
    command: str,
    launch: Launch,
) -> str:
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    container = (
        f"--container-image={shlex.quote(pinned.enroot)} \\\n"
        f"  --container-mounts={shlex.quote(f'{project_dir}:{WORKSPACE}')}"
        " --container-workdir=/workspace"
    )
    if not launch.multi_node:
        return _template("pyxis.sh.in").substitute(
            **common, platform_check=check, exports=exports, container=container, command=command
        )
    # The torchrun line is the step's own command, in the container: a constant bash
    # script makes the first node (SLURM_NODEID, which enroot passes in) the rendezvous
    # host, with the address the batch host found as the one its workers are given
    # (torch's guess from the host name can be `localhost`); TARGET follows as its
    # arguments, never as shell text.
    torchrun = _template("torchrun.sh.in").template
    rendezvous = torchrun[: torchrun.index("gpuenv_node() {")]
    conf = f"--rdzv-conf=join_timeout={launch.rendezvous_timeout},is_host"
    node = (
        '\'if [ "${SLURM_NODEID:-}" = 0 ]; then'
        f' set -- {conf}=true --local-addr="$GPUENV_RDZV_HEAD" "$@";'
        f' else set -- {conf}=false "$@"; fi;'
        ' exec python3 -m torch.distributed.run "$@"\''
    )
    body = (
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID\n"
        f"{exports}{rendezvous}"
        "nproc=${SLURM_GPUS_ON_NODE:-0}  # per node, as Slurm counts them; one on the CPU\n"
        '[ "$nproc" -gt 0 ] || nproc=1\n'
        f"exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 {container} \\\n"
        f"  bash -c {node} gpuenv-node \\\n"
        f'  --nnodes={launch.nodes} --nproc-per-node="$nproc" --rdzv-backend=c10d \\\n'
        '  --rdzv-endpoint="$GPUENV_RDZV_ENDPOINT" --rdzv-id="$SLURM_JOB_ID" \\\n'
        "  --max-restarts=0 --no-python \\\n"
        f"  {command}\n"
    )
    return _script("pyxis", common, check, body)


def _apptainer(
    common: Mapping[str, str],
    check: str,
    pinned: PinnedImage,
    project_dir: str,
    env: Mapping[str, str],
    passthrough: Sequence[str],
    command: str,
    launch: Launch,
) -> str:
    if not launch.sif_cache.startswith("/"):
        raise UsageError(f"the SIF cache {launch.sif_cache!r} is not an absolute path")
    # APPTAINERENV_KEY reaches the container as KEY even with --cleanenv; `--env` would
    # split values at commas. A bare -e KEY is copied from the job's environment.
    exports = "".join(f"export APPTAINERENV_{k}={shlex.quote(v)}\n" for k, v in env.items())
    exports += "".join(f'export APPTAINERENV_{k}="${{{k}-}}"\n' for k in passthrough)
    run = (
        'apptainer exec --cleanenv "${gpu_args[@]}" \\\n'
        f"  --bind {shlex.quote(f'{project_dir}:{WORKSPACE}')} --pwd /workspace \\\n"
        '  "$sif"'
    )
    step = _template("apptainer-step.sh.in").template
    if launch.multi_node:
        # The interface found on the node, unless -e or the spec named one.
        node_step = step + "".join(
            f'export APPTAINERENV_{name}="${{APPTAINERENV_{name}:-${{{name}:-}}}}"\n'
            for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
        )
        body = "export sif\n" + _torchrun(launch, node_step, run.replace("\n", "\n  "), command)
    else:
        body = step + f"exec {run} \\\n  {command}\n"
    return _template("apptainer.sh.in").substitute(
        **common,
        platform_check=check,
        sif_cache=shlex.quote(launch.sif_cache),
        sif_name=shlex.quote(pinned.sif_name),
        pull_flags=" --no-https" if pinned.insecure else "",
        source=shlex.quote(pinned.apptainer),
        exports=exports,
        launch=body.rstrip("\n"),
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
