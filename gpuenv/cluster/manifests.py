"""The locked environment for other schedulers, as data: Kubernetes (a Job, or for
several nodes an Indexed Job and its headless Service, queued by Kueue if asked) and
Compose services. Serialized as YAML by the CLI, never pasted into text."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuenv.cluster.slurm import DEFAULT_RENDEZVOUS_TIMEOUT, job_name
from gpuenv.common.platforms import arch_of
from gpuenv.errors import UsageError
from gpuenv.project.mounts import Bind
from gpuenv.project.spec import WORKSPACE, Spec, is_mig_profile

# The Kubernetes versions the docs promise, each checked by the tests with
# kubernetes-validate --strict against its offline schemas.
# Kueue picks up a Job by this label (kueue.sigs.k8s.io/docs/tasks/run/jobs/).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
_DNS = re.compile(r"[^a-z0-9-]+")
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # a DNS subdomain
RENDEZVOUS_PORT = 29500


@dataclass(frozen=True)
class KubernetesOptions:
    """What the cluster asks of a Job beyond the image: its queue, nodes, GPU kind and
    the secrets for pulling from a private registry."""

    queue: str | None = None
    nodes: int = 1
    mig: str | None = None
    pull_secrets: tuple[str, ...] = ()
    rendezvous_timeout: int = DEFAULT_RENDEZVOUS_TIMEOUT
    env_secret: str | None = None  # the Secret of the -e variables; None: env_secret()

    def check(self) -> None:
        if self.mig is not None and not is_mig_profile(self.mig):
            raise UsageError(
                f"--mig {self.mig!r}: not a MIG profile like 1g.10gb, 3g.40gb or 1g.10gb+me"
            )
        named = [
            ("--queue", self.queue),
            ("--env-secret", self.env_secret),
            *(("--pull-secret", s) for s in self.pull_secrets),
        ]
        for what, name in named:
            if name is not None and not _OBJECT_NAME.match(name):
                raise UsageError(f"{what} {name!r}: not a Kubernetes object name")


def _dns_name(text: str, suffix: str, room: int = 0) -> str:
    """A DNS label of at most 63 characters, leaving `room` for a pod's `-INDEX`."""
    limit = 63 - room - len(suffix) - 1
    base = _DNS.sub("-", text.lower()).strip("-")[:limit].strip("-") or "job"
    return f"{base}-{suffix}"


def env_secret(spec: Spec) -> str:
    """The Secret an exported Job reads its -e and --env-file variables from, unless
    --env-secret names another: one per project, so it outlives the Job's hash.

    >>> from gpuenv.project.spec import default_spec
    >>> env_secret(default_spec("/srv/My_Project"))
    'gpuenv-my-project-env'
    """
    return _dns_name(job_name(spec), "env")


def torchrun_command(
    command: Sequence[str], nodes: int, nproc: int, endpoint: str, run_id: str, timeout: int
) -> list[str]:
    """torchrun with a c10d rendezvous at `endpoint`, every argument its own word."""
    return [
        "python3",
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={run_id}",
        f"--rdzv-conf=join_timeout={timeout}",
        "--max-restarts=0",
        "--no-python",
        *command,
    ]


def kubernetes_manifests(
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
    options: KubernetesOptions = KubernetesOptions(),
    referenced: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """A batch/v1 Job: the image by digest, GPUs as nvidia.com/gpu (or a MIG profile),
    /dev/shm sized from the spec, a non-root user, Never restarted, no retries; on nodes
    of the image's platform (kubernetes.io/arch) when it is known. On several nodes, an
    Indexed Job of one pod per node running torchrun, found by the headless Service.
    `env` is written as values; each of `referenced` is read from the key of its name in
    the Secret `options.env_secret` (the project's env_secret() by default)."""
    options.check()
    name = _object_name(spec, image, command, options.nodes)
    labels = {"app.kubernetes.io/managed-by": "gpuenv", "io.gpuenv/project": spec.name}
    argv = _argv(command, name, gpus, options)
    secret = options.env_secret or env_secret(spec)
    mig = _mig_profile(spec, options)
    container = _container(image, argv, _env_list(env, referenced, secret), gpus, mig)
    if options.nodes > 1:
        container["ports"] = [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT}]
    pod = _pod(
        container,
        uid=uid,
        gid=gid,
        shm_size=shm_size,
        pull_secrets=options.pull_secrets,
        platform=platform,
        subdomain=name if options.nodes > 1 else None,
    )
    return _job_manifests(name, labels, pod, options)


def _object_name(spec: Spec, image: str, command: Sequence[str], nodes: int) -> str:
    """The Job's (and Service's) name: the project's, and a hash of what it runs, with
    room left for a pod's `-INDEX` on several nodes."""
    suffix = hashlib.sha256(json.dumps([image, list(command), nodes]).encode()).hexdigest()[:8]
    room = len(str(nodes - 1)) + 1 if nodes > 1 else 0
    return _dns_name(job_name(spec), suffix, room)


def _argv(command: Sequence[str], name: str, gpus: int, options: KubernetesOptions) -> list[str]:
    """The command; on several nodes, under torchrun, meeting at pod 0 of the Service."""
    if options.nodes <= 1:
        return list(command)
    endpoint = f"{name}-0.{name}:{RENDEZVOUS_PORT}"
    return torchrun_command(
        command, options.nodes, gpus or 1, endpoint, name, options.rendezvous_timeout
    )


def _mig_profile(spec: Spec, options: KubernetesOptions) -> str | None:
    """The MIG profile to ask for: --mig, else the spec's `gpus: {mig: PROFILE, count: N}`.
    MIG instances the spec names by UUID are a usage error without one."""
    mig = options.mig or (spec.gpus.profile if spec.gpus.mode == "mig" else None)
    named = [d for d in spec.gpus.devices if d.startswith("MIG-")]
    if named and mig is None:
        raise UsageError(
            f"gpus: [{named[0]}, ...] in the spec names MIG instances of one host: a Kubernetes "
            "Job cannot ask for devices by UUID, and nvidia.com/gpu would be whole GPUs",
            hint="ask for slices by profile: --mig 1g.10gb, or gpus: {mig: 1g.10gb, count: N}",
        )
    return mig


def _pod(
    container: dict[str, Any],
    *,
    uid: int,
    gid: int,
    shm_size: int,
    pull_secrets: Sequence[str],
    platform: str | None,
    subdomain: str | None,
) -> dict[str, Any]:
    """The pod spec: a non-root user (1000 for root) with a HOME and a working folder it
    can write (the baked project copied there by an init container), /dev/shm in memory,
    the pull secrets, the image's platform, and the headless Service's subdomain on
    several nodes."""
    user = uid if uid != 0 else 1000
    group = gid if uid != 0 else 1000
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": {
            "runAsUser": user,
            "runAsGroup": group,
            "runAsNonRoot": True,
            "fsGroup": group,
        },
        "containers": [container],
        "volumes": [
            {
                "name": "dshm",
                "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_size // 2**20}Mi"},
            }
        ],
    }
    # As `gpuenv run` gives: a HOME of the user's, and a working folder it can write.
    # The project baked into the image belongs to whoever built it, so an init container
    # (the same image, the same user) copies it into a folder of the pod's own.
    container["env"] = [*_home_env(container["env"]), *container["env"]]
    container["volumeMounts"] = [
        *container["volumeMounts"],
        {"name": "workspace", "mountPath": WORKSPACE},
        {"name": "home", "mountPath": POD_HOME},
    ]
    pod["initContainers"] = [
        {
            "name": "workspace",
            "image": container["image"],
            "command": ["cp", "-R", f"{WORKSPACE}/.", "/work/"],  # GNU and busybox alike
            "volumeMounts": [{"name": "workspace", "mountPath": "/work"}],
            "securityContext": {"allowPrivilegeEscalation": False},
        }
    ]
    pod["volumes"] += [{"name": "workspace", "emptyDir": {}}, {"name": "home", "emptyDir": {}}]
    if pull_secrets:
        pod["imagePullSecrets"] = [{"name": secret} for secret in pull_secrets]
    if platform:
        pod["nodeSelector"] = {"kubernetes.io/arch": arch_of(platform)}
    if subdomain is not None:
        # Pod i is NAME-i.NAME in DNS: the Job's subdomain is the headless Service.
        pod["subdomain"] = subdomain
    return pod


def _job_manifests(
    name: str, labels: Mapping[str, str], pod: dict[str, Any], options: KubernetesOptions
) -> list[dict[str, Any]]:
    """The Job of `pod`, suspended for Kueue when queued; on several nodes an Indexed Job
    after the headless Service its pods find each other through."""
    job_labels = dict(labels)
    job_spec: dict[str, Any] = {"backoffLimit": 0}
    if options.queue:
        job_labels[KUEUE_QUEUE_LABEL] = options.queue
        # Created suspended, as in Kueue's sample Job: Kueue's webhook would suspend it
        # anyway and unsuspends it once the queue admits it; never started before that.
        job_spec["suspend"] = True
    manifests: list[dict[str, Any]] = []
    pod_labels = dict(labels)
    if options.nodes > 1:
        pod_labels["io.gpuenv/job"] = name
        job_spec.update(
            completionMode="Indexed", completions=options.nodes, parallelism=options.nodes
        )
        manifests.append(_headless_service(name, labels))
    job_spec["template"] = {"metadata": {"labels": pod_labels}, "spec": pod}
    manifests.append(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "labels": job_labels},
            "spec": job_spec,
        }
    )
    return manifests


def _headless_service(name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """The Service that gives each pod of an Indexed Job its DNS name."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "clusterIP": "None",
            "selector": {"io.gpuenv/job": name},
            # Pods find each other before they are Ready.
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT}],
        },
    }


POD_HOME = "/home/gpuenv"  # the Job's user has no passwd entry in the image: HOME is given


def _home_env(env: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """HOME for the Job's user, unless the spec's env sets one."""
    return (
        []
        if any(item.get("name") == "HOME" for item in env)
        else [{"name": "HOME", "value": POD_HOME}]
    )


def _env_list(
    env: Mapping[str, str], referenced: Sequence[str], secret: str
) -> list[dict[str, Any]]:
    """The container's env: values, then each referenced name from the Secret's key of that
    name (a variable name is a valid Secret key: [-._a-zA-Z0-9]+)."""
    # gpuenv's device order wins, as in a run (one entry: Kubernetes warns about a name
    # given twice, and server-side apply merges them unpredictably).
    ours = "CUDA_DEVICE_ORDER"
    values = [{"name": k, "value": v} for k, v in env.items() if k not in referenced and k != ours]
    refs = [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": name}}}
        for name in referenced
        if name != ours
    ]
    return [*values, *refs, {"name": ours, "value": "PCI_BUS_ID"}]


def _container(
    image: str, argv: list[str], env: list[dict[str, Any]], gpus: int, mig: str | None
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "command": argv,
        "workingDir": WORKSPACE,
        "env": env,
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    if gpus:
        resource = f"nvidia.com/mig-{mig}" if mig else "nvidia.com/gpu"
        container["resources"] = {"limits": {resource: gpus}}
    return container


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
    referenced: Sequence[str] = (),
) -> dict[str, Any]:
    """A Compose service; the GPU reservation names a count or device ids, never neither
    (since Engine 27.3 that means no GPU at all); the image's platform when known.
    `binds`: the spec's mounts as gpuenv.project.mounts decided them (as for a run).
    `referenced`: variables written as a name without a value, which Compose takes from
    the environment `docker compose` runs in (unset in the container where that has
    none: compose-spec/compose-go#654)."""
    if spec.gpus.mode == "mig" and not device_ids:
        raise UsageError(
            f"gpus: {spec.gpus} in the spec: Compose cannot reserve MIG instances by profile "
            "(its device reservations take a count of whole GPUs or device ids)",
            hint="name the instances in the spec (gpus: [MIG-<uuid>, ...]; `gpuenv doctor` "
            "lists them) or export for Kubernetes, which schedules nvidia.com/mig-<profile>",
        )
    service: dict[str, Any] = {
        "image": image,
        "command": [_literal(word) for word in command],
        "working_dir": WORKSPACE,
        "volumes": [_literal(f"{spec.project_dir}:{WORKSPACE}")]
        + [_literal(f"{b.source}:{b.target}{':ro' if b.read_only else ''}") for b in binds],
        "environment": {
            **{k: _literal(v) for k, v in env.items() if k not in referenced},
            **dict.fromkeys(referenced),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        },
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


def _literal(text: str) -> str:
    """`text` as Compose reads it literally: it interpolates `$VAR` from the environment
    `docker compose` runs in, and `$$` is its literal `$` (the spec's values are already
    expanded against the image's environment).

    >>> _literal("costs $5 at ${HOME}")
    'costs $$5 at $${HOME}'
    """
    return text.replace("$", "$$")
