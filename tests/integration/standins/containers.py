#!/usr/bin/python3
"""Stand-ins for `apptainer`, `enroot` and pyxis's `srun --container-*` (test fixtures,
not part of gpuenv): none of them can be installed on the test machines. Each checks the
arguments gpuenv's scripts give it as the real tool would read them, pulls the image by
digest from the registry for real (manifest and layers, digests verified), and runs the
command with the image's own Python. There is no chroot (no user namespaces here): the
image's root is unpacked into a folder and its interpreter runs with PYTHONHOME there,
which is enough for Debian + Python images such as the stand-ins.

Invoked as `apptainer`, `enroot` or `srun` (links to this file). Every call is appended
as a JSON line to $GPUENV_TEST_STANDIN_LOG. $GPUENV_TEST_STANDIN_HANG=NODE makes the step
on that Slurm node hang instead of starting, as a node whose container never comes up.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.request

DIGEST = r"sha256:[0-9a-f]{64}"
APPTAINER_SOURCE = re.compile(
    rf"^docker://(?P<registry>[^/]+)/(?P<repo>[a-z0-9/._-]+)@(?P<digest>{DIGEST})$"
)
# enroot import's documented grammar, docker://[USER@][REGISTRY#]IMAGE[:TAG] (enroot 3.x);
# gpuenv must put the digest where the tag goes.
ENROOT_URI = re.compile(
    r"^docker://((?P<user>[^@#]+)@)?((?P<registry>[^#]+)#)?(?P<repo>[a-z0-9/._-]+)"
    r"(:(?P<tag>[A-Za-z0-9._:-]+))?$"
)
ACCEPT = ", ".join(
    [
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.index.v1+json",
    ]
)


def fail(tool: str, message: str, code: int = 255) -> None:
    print(f"{tool} (stand-in): {message}", file=sys.stderr)
    sys.exit(code)


def log(tool: str, argv: list[str]) -> None:
    path = os.environ.get("GPUENV_TEST_STANDIN_LOG")
    if path:
        entry = {"tool": tool, "argv": argv, "node": os.environ.get("SLURMD_NODENAME")}
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")


def _get(url: str, accept: str | None = None) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read()


def pull(tool: str, registry: str, repo: str, digest: str, scheme: str, root: str) -> None:
    """The image's layers, unpacked in order into `root` (whiteouts applied), and its
    config's environment in `root`.env.json."""
    base = f"{scheme}://{registry}/v2/{repo}"
    body = _get(f"{base}/manifests/{digest}", ACCEPT)
    if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
        fail(tool, f"the registry's manifest does not have the digest {digest}")
    manifest = json.loads(body)
    if "manifests" in manifest:  # an index: the linux/amd64 image
        (chosen,) = [
            m for m in manifest["manifests"] if m.get("platform", {}).get("architecture") == "amd64"
        ]
        manifest = json.loads(_get(f"{base}/manifests/{chosen['digest']}", ACCEPT))
    config = json.loads(_get(f"{base}/blobs/{manifest['config']['digest']}"))
    with open(f"{root}.env.json.{os.getpid()}", "w", encoding="utf-8") as handle:
        json.dump(config.get("config", {}).get("Env") or [], handle)
    os.replace(handle.name, root + ".env.json")
    partial = f"{root}.partial-{os.getpid()}"  # two nodes may pull at once
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    for layer in manifest["layers"]:
        with tempfile.TemporaryFile() as blob:
            data = _get(f"{base}/blobs/{layer['digest']}")
            if "sha256:" + hashlib.sha256(data).hexdigest() != layer["digest"]:
                fail(tool, f"layer {layer['digest']} does not match its digest")
            blob.write(data)
            blob.seek(0)
            _unpack(blob, partial)
    try:
        os.rename(partial, root)
    except OSError:  # another pull finished first: the same digest, the same files
        shutil.rmtree(partial, ignore_errors=True)


def _unpack(blob, root: str) -> None:
    with tarfile.open(fileobj=blob, mode="r:*") as archive:
        for member in archive:
            name = os.path.normpath(member.name).lstrip("/")
            if name.startswith(".."):
                continue
            folder, base = os.path.split(name)
            if base == ".wh..wh..opq":
                target = os.path.join(root, folder)
                for entry in os.listdir(target) if os.path.isdir(target) else []:
                    _remove(os.path.join(target, entry))
                continue
            if base.startswith(".wh."):
                _remove(os.path.join(root, folder, base[4:]))
                continue
            if member.isdev() or member.isfifo():
                continue
            target = os.path.join(root, name)
            if not member.isdir() and os.path.lexists(target):
                _remove(target)
            if member.islnk():
                member.linkname = os.path.normpath(member.linkname).lstrip("/")
            archive.extract(member, root, set_attrs=False)
            if member.isdir():
                os.chmod(target, 0o755)
            elif member.isfile():
                os.chmod(target, (member.mode & 0o777) | 0o600)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def write_image(tool: str, dest: str, digest: str, source: str, scheme: str, parsed) -> None:
    """The image file (a SIF, a squashfs) as a JSON note; its root is shared by digest."""
    root = os.path.join(
        os.path.dirname(os.path.abspath(dest)), ".rootfs-" + digest.replace(":", "-")
    )
    if not os.path.isdir(root):
        pull(tool, parsed["registry"], parsed["repo"], digest, scheme, root)
    with open(dest, "w", encoding="utf-8") as handle:
        json.dump({"stand-in": tool, "digest": digest, "source": source, "rootfs": root}, handle)


def read_image(tool: str, path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError) as error:
        fail(tool, f"{path} is not an image file: {error}")
        raise


def hang_here() -> None:
    if os.environ.get("GPUENV_TEST_STANDIN_HANG") == os.environ.get("SLURMD_NODENAME", "-"):
        while True:
            time.sleep(60)


def run_in(tool: str, image: dict, env: dict[str, str], workdir: str, command: list[str]) -> None:
    """exec `command` with the image's Python, its environment and then `env`."""
    hang_here()
    root = image["rootfs"]
    with open(root + ".env.json", encoding="utf-8") as handle:
        baked = dict(entry.partition("=")[::2] for entry in json.load(handle))
    image_path = baked.pop("PATH", "/usr/local/bin:/usr/bin:/bin")
    paths = [root + folder for folder in image_path.split(":")] + ["/usr/bin", "/bin"]
    env = {**baked, **env, "PATH": ":".join(paths), "PYTHONHOME": f"{root}/usr"}
    executable = shutil.which(command[0], path=env["PATH"])
    if executable is None:
        fail(tool, f"{command[0]}: not found in the image", 127)
    os.chdir(workdir)
    os.execve(executable, command, env)


def apptainer(argv: list[str]) -> None:
    tool = "apptainer"
    if argv[:1] == ["pull"]:
        args = argv[1:]
        https = "--no-https" not in args
        args = [a for a in args if a not in ("--force", "--no-https")]
        if len(args) != 2:
            fail(tool, f"pull takes DEST SOURCE, got {args}")
        dest, source = args
        match = APPTAINER_SOURCE.match(source)
        if not match:
            fail(tool, f"{source}: expected docker://REGISTRY/REPO@sha256:… (a pinned digest)")
        write_image(tool, dest, match["digest"], source, "https" if https else "http", match)
        return
    if argv[:1] != ["exec"]:
        fail(tool, f"this stand-in knows pull and exec, not {argv[:1]}")
    args, binds, options = argv[1:], [], {"nv": False, "cleanenv": False, "pwd": None}
    while args and args[0].startswith("--"):
        option = args.pop(0)
        if option in ("--nv", "--cleanenv"):
            options[option[2:]] = True
        elif option in ("--bind", "--pwd"):
            value = args.pop(0)
            binds.extend(value.split(",")) if option == "--bind" else options.update(pwd=value)
        else:
            fail(tool, f"exec: this stand-in does not know {option}")
    sif, command = args[0], args[1:]
    image = read_image(tool, sif)
    mounts = dict(reversed(b.split(":")[:2]) for b in binds)
    if "/workspace" not in mounts or options["pwd"] != "/workspace":
        fail(tool, f"expected --bind PROJECT:/workspace --pwd /workspace, got {binds} {options}")
    passed = {
        k[len("APPTAINERENV_") :]: v for k, v in os.environ.items() if k.startswith("APPTAINERENV_")
    }
    visible = passed.get("NVIDIA_VISIBLE_DEVICES", "")
    granted = os.environ.get("SLURM_STEP_GPUS") or os.environ.get("SLURM_JOB_GPUS") or ""
    if options["nv"] != bool(granted) or (granted and visible != granted):
        fail(
            tool,
            f"--nv={options['nv']} with NVIDIA_VISIBLE_DEVICES={visible!r}: Slurm granted {granted!r}",
        )
    if not options["cleanenv"]:
        fail(tool, "expected --cleanenv: the login node's environment stays out")
    env = {"HOME": os.environ.get("HOME", "/"), "USER": os.environ.get("USER", ""), **passed}
    run_in(tool, image, env, mounts["/workspace"], command)


def enroot(argv: list[str]) -> None:
    tool = "enroot"
    if argv[:1] == ["import"]:
        args = argv[1:]
        if len(args) != 3 or args[0] not in ("-o", "--output"):
            fail(tool, f"import takes --output FILE URI, got {args}")
        dest, uri = args[1], args[2]
        match = ENROOT_URI.match(uri)
        if not match or not match["registry"]:
            fail(tool, f"[ERROR] Invalid image reference: {uri}", 1)
        tag = match["tag"] or "latest"
        if not re.match(rf"^{DIGEST}$", tag):
            fail(tool, f"{uri}: the tag is {tag!r}, not the pinned digest", 1)
        scheme = "http" if os.environ.get("ENROOT_ALLOW_HTTP") else "https"
        write_image(tool, dest, tag, uri, scheme, match)
        return
    if argv[:1] == ["start"]:
        args, mounts = argv[1:], {}
        while args and args[0].startswith("--"):
            option = args.pop(0)
            if option == "--mount":
                source, target = args.pop(0).split(":")[:2]
                mounts[target] = source
            elif option != "--rw":
                fail(tool, f"start: this stand-in does not know {option}")
        image, command = read_image(tool, args[0]), args[1:]
        workdir = os.environ.pop("GPUENV_STANDIN_WORKDIR", "/")
        inside = {t: s for t, s in mounts.items() if workdir == t or workdir.startswith(t + "/")}
        if not inside:
            fail(tool, f"the working directory {workdir} is not mounted ({mounts})")
        target = max(inside, key=len)
        run_in(tool, image, dict(os.environ), inside[target] + workdir[len(target) :], command)
    fail(tool, f"this stand-in knows import and start, not {argv[:1]}")


def srun(argv: list[str]) -> None:
    """pyxis's part of srun: --container-* options make each task import the image with
    enroot and start the command in it; the rest goes to the real srun."""
    container, rest = {}, []
    for argument in argv:
        key, _, value = argument.partition("=")
        if key in ("--container-image", "--container-mounts", "--container-workdir"):
            container[key[len("--container-") :]] = value
        else:
            rest.append(argument)
    real = os.environ.get("GPUENV_TEST_REAL_SRUN", "/usr/bin/srun")
    if not container:
        os.execv(real, [real, *rest])
    if "image" not in container:
        fail("pyxis", "--container-mounts without --container-image")
    options, command = [], rest
    while command and command[0].startswith("-"):
        options.append(command.pop(0))
    task = [sys.executable, os.path.abspath(__file__), "pyxis-task", json.dumps(container)]
    os.execv(real, [real, *options, *task, *command])


def pyxis_task(container: dict[str, str], command: list[str]) -> None:
    hang_here()
    folder = os.path.dirname(os.path.abspath(__file__))
    image = container["image"]
    uri = image if image.startswith("docker://") else f"docker://{image}"  # as pyxis does
    cache = os.path.join(os.environ["GPUENV_TEST_ENROOT_CACHE"], f"{os.getpid()}.sqsh")
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    enroot_path = os.path.join(folder, "enroot")
    imported = os.spawnv(os.P_WAIT, enroot_path, [enroot_path, "import", "--output", cache, uri])
    if imported != 0:
        fail("pyxis", f"failed to import docker image: {image}", 1)
    mounts = []
    for mount in filter(None, container.get("mounts", "").split(",")):
        mounts += ["--mount", mount]
    os.environ["GPUENV_STANDIN_WORKDIR"] = container.get("workdir", "/")
    os.execv(enroot_path, [enroot_path, "start", "--rw", *mounts, cache, *command])


def main() -> None:
    tool = os.path.basename(sys.argv[0])
    argv = sys.argv[1:]
    if argv[:1] == ["pyxis-task"]:
        pyxis_task(json.loads(argv[1]), argv[2:])
        return
    log(tool, argv)
    {"apptainer": apptainer, "enroot": enroot, "srun": srun}[tool](argv)


if __name__ == "__main__":
    main()
