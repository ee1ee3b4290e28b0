"""Installs a project's Python dependencies into an NGC image, as gpuenv planned them.

Run by the image's own python3 at build time (so it needs nothing but pip). It reads the
files gpuenv wrote into FOLDER:

  image.tsv        packages the image provides: NAME, the project's specifier, where the
                   pin was written, and the series to install when the image lacks it
  install.txt      requirements pip installs (pip options first)
  late.txt         requirements that compile against the image's torch: installed last,
                   without build isolation (unless the image ships them)
  constraints.txt  the project's own -c constraints

and checks, before pip runs, every pin against what the image has: the versions of its
installed distributions and the pins of its pip constraint files (PIP_CONSTRAINT, e.g. NGC
PyTorch's /etc/pip/constraint.txt). A conflict is printed as one line, starting with
"gpuenv: conflict:", naming the package, the project's pin and the image's version, and
the build stops. NVIDIA's builds match a pin "in the NGC sense": an exact pin ==X.Y.Z is
satisfied by any build of the X.Y series (0.20.0a0+afc54f7 for ==0.20.1), any other
specifier by the release the build precedes. This mirrors gpuenv.project.packages
(ngc_satisfies); tests/unit/test_ngc_pins.py holds the two to the same table.

    install.py FOLDER [--cached] [--uv UV]

The installer is uv (`uv pip install --system`) when UV runs in this image, else pip.
Both get the same constraints, explicitly: the image's framework builds as installed
(keep.txt), the image's pip constraint files (PIP_CONSTRAINT, which uv does not read)
and the project's own. With --cached their download caches are cache mounts that outlive
the build (never in the image; pip-install.sh passes it only for a cache that is this
build's user's alone, cache-ours.sh); without, neither keeps a cache. When a requirement cannot be installed, the last
line is "gpuenv: failed: NAME (FILE:LINE): the installer's reason".
"""

import argparse
import os
import re
import subprocess
import sys
from importlib import metadata

try:
    from packaging.requirements import Requirement
    from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version
except ImportError:  # every pip vendors it
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import InvalidVersion, Version

KEPT = ("torch", "torchvision", "torchaudio", "torchtext", "triton", "tensorflow", "jax", "jaxlib")


def build_label(version):
    """gpuenv.project.packages.build_label: pytorch.org's +cu121, +cpu, +rocm6.0."""
    local = version.partition("+")[2].lower()
    return local if re.fullmatch(r"cu\d+|cpu|rocm[\d.]+|xpu", local) else None


def satisfies(specifier, shipped):
    """gpuenv.project.packages.ngc_satisfies, standalone (tests/unit/test_ngc_pins.py
    runs one table through both)."""
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
                if not Specifier("==" + str(pinned)).contains(build, prereleases=True):
                    return False
            elif build.is_prerelease or build.local is not None:
                if pinned.release[:2] != build.release[:2]:
                    return False
            elif Version(build.public) != pinned:
                return False
        elif not item.contains(base, prereleases=True):
            return False
    return True


def lines(folder, name):
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle if line.strip()]


def requirement(line):
    """(Requirement, where) of an `install.txt` line ``REQ  # where``; None for options."""
    if line.startswith("-"):
        return None
    text, _, where = line.partition("  # ")
    return Requirement(text), where or "?"


def constraint_pins():
    pins = {}
    for path in os.environ.get("PIP_CONSTRAINT", "").split():
        try:
            with open(path, encoding="utf-8") as handle:
                for raw in handle:
                    text = raw.split("#", 1)[0].strip()
                    if "==" not in text or text.startswith("-"):
                        continue
                    name, _, version = text.partition("==")
                    pins[canonicalize_name(name.split("[")[0])] = (version.strip(), path)
        except OSError:
            continue
    return pins


PIP_OPTIONS_FOR_UV = {
    "--pre": ["--prerelease=allow"],
    "--prefer-binary": [],  # uv prefers wheels anyway
}


class Installer:
    """pip or uv, run the same way for each call: the image's own python3, its system
    site-packages (NVIDIA's builds are there), the constraints given. `where` names the
    file and line of each requirement, for the message when one cannot be installed."""

    def __init__(self, uv, cached, where=None):
        self.uv = uv
        self.cached = cached
        self.where = where or {}

    def install(self, *args):
        if self.uv:
            command = [self.uv, "pip", "install", "--system", "--break-system-packages",
                       "--python", sys.executable, *_image_constraints(), *_uv_args(args)]
            env = dict(os.environ, UV_LINK_MODE="copy", UV_PYTHON_DOWNLOADS="never",
                       UV_NO_PROGRESS="1")
            env.pop("UV_TORCH_BACKEND", None)  # never pick torch builds for the build host
            if not self.cached:
                env["UV_NO_CACHE"] = "1"
        else:
            command = [sys.executable, "-m", "pip", "install", *args]
            env = dict(os.environ, PIP_BREAK_SYSTEM_PACKAGES="1",
                       PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_ROOT_USER_ACTION="ignore",
                       PIP_NO_INPUT="1")
            if not self.cached:
                env["PIP_NO_CACHE_DIR"] = "1"
        name = "uv pip" if self.uv else "pip"
        print(f"gpuenv: {name} install " + " ".join(args), flush=True)
        tail = []
        with subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace") as child:
            for line in child.stdout:
                print(line, end="", flush=True)
                tail = (tail + [line.rstrip()])[-40:]
        if child.returncode:
            print(f"gpuenv: failed: {self.explain(tail)}", flush=True)
            sys.exit(child.returncode)

    def explain(self, tail):
        """The installer's own reason in one line, with the file and line of the
        requirement it names first: `tqdm==99 (requirements.txt:2): No matching ...`.
        pip ends with `ERROR: ...` lines; uv, without a terminal, with `error: ...` and
        `  cause: ...`."""
        reasons = [line.strip() for line in tail
                   if line.lstrip().startswith(("ERROR:", "error:", "cause:"))]
        reason = reasons[-1] if reasons else (tail[-1].strip() if tail else "no output")
        for prefix in ("ERROR: ", "error: ", "cause: "):  # (no removeprefix before 3.9)
            if reason.startswith(prefix):
                reason = reason[len(prefix):]
        text = reason.lower().replace("_", "-")
        named = [(_mention(text, name), name) for name in self.where]
        named = sorted((at, name) for at, name in named if at >= 0)
        if named:
            name = named[0][1]
            return f"{name} ({self.where[name]}): {reason}"
        return reason

    def install_file(self, path, *constraints):
        """A requirements file's packages: pip reads its options (the index) itself; uv
        gets them on its command line, as it spells them."""
        if not self.uv:
            self.install(*constraints, "-r", path)
            return
        given = lines(os.path.dirname(path), os.path.basename(path))
        listed = path + ".uv"
        with open(listed, "w", encoding="utf-8") as handle:
            handle.writelines(f"{line}\n" for line in given if not line.startswith("-"))
        index = [line for line in given if line.startswith("-")]
        self.install(*index, *constraints, "-r", listed)


def _mention(text, name):
    """Where `name` (canonical) first appears in `text` as a whole name; -1: nowhere."""
    start = text.find(name)
    while start != -1:
        end = start + len(name)
        before = text[start - 1] if start else " "
        after = text[end] if end < len(text) else " "
        if not (before.isalnum() or before in "-.") and not (after.isalnum() or after == "-"):
            return start
        start = text.find(name, start + 1)
    return -1


def _image_constraints():
    """pip reads PIP_CONSTRAINT (NGC PyTorch's /etc/pip/constraint.txt) itself; uv does
    not: each file is named to it."""
    files = os.environ.get("PIP_CONSTRAINT", "").split()
    return [word for path in files if os.path.isfile(path) for word in ("-c", path)]


def _uv_args(args):
    """pip's options as uv spells them (`--pre`, `--trusted-host`); the others are the same."""
    out = []
    for arg in args:
        name, equals, value = arg.partition("=")
        if name in PIP_OPTIONS_FOR_UV:
            out += PIP_OPTIONS_FOR_UV[name]
        elif name == "--trusted-host":
            out.append(f"--allow-insecure-host={value}")
        else:
            out.append(arg)
    return out


def find_uv(path):
    """UV when it runs in this image (a stage that could not install it leaves none)."""
    if not path or not os.access(path, os.X_OK):
        return None
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True)
    except OSError:
        return None
    if done.returncode:
        return None
    print(f"gpuenv: installing with {done.stdout.strip()}", flush=True)
    return path


def main(folder, options):
    installed = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            installed.setdefault(canonicalize_name(name), dist.version)
    pinned = constraint_pins()
    conflicts, companions = [], []
    for line in lines(folder, "image.tsv"):
        name, specifier, where, hold = (line.split("\t") + ["", "", ""])[:4]
        have = installed.get(name)
        wanted = f"{name}{specifier}" if specifier else f"{name} (unpinned)"
        if have is not None:
            if satisfies(specifier, have):
                print(f"gpuenv: {wanted} ({where}): left to the image ({name} {have})")
            else:
                conflicts.append(f"{name}{specifier} ({where}): the image has {name} {have} "
                                 "(NVIDIA's build, kept); pin that series or choose another image")
        elif hold and satisfies(specifier, f"{hold}.0a0"):  # a build of that series
            print(f"gpuenv: {wanted} ({where}): not in the image; installing {name}=={hold}.* "
                  "(the build for the image's torch) without dependencies")
            companions.append(f"{name}=={hold}.*")
        else:
            held = f"; the build for the image's torch is {hold}.*" if hold else ""
            conflicts.append(f"{wanted} ({where}): the image has no {name}{held}; gpuenv "
                             "does not install another build of it over NVIDIA's framework")
    late = []
    for source in ("install.txt", "late.txt"):
        for line in lines(folder, source):
            parsed = requirement(line)
            if parsed is None:
                continue
            req, where = parsed
            name = canonicalize_name(req.name)
            if name in pinned:
                version, path = pinned[name]
                if req.url or not satisfies(str(req.specifier), version):
                    conflicts.append(f"{req} ({where}): the image pins {name}=={version} in "
                                     f"{path}; relax the pin or choose another image")
                continue
            if source == "late.txt":
                have = installed.get(name)
                if have is not None and not req.url and satisfies(str(req.specifier), have):
                    print(f"gpuenv: {req} ({where}): left to the image ({name} {have})")
                    continue
                late.append(str(req))
    if conflicts:
        for text in conflicts:
            print(f"gpuenv: conflict: {text}", flush=True)
        sys.exit(3)
    keep = os.path.join(folder, "keep.txt")
    with open(keep, "w", encoding="utf-8") as handle:
        for name in KEPT:
            if name in installed:
                handle.write(f"{name}=={installed[name]}\n")
    constraints = ["-c", keep] if lines(folder, "keep.txt") else []
    if lines(folder, "constraints.txt"):
        constraints += ["-c", os.path.join(folder, "constraints.txt")]
    where = {}
    for source in ("install.txt", "late.txt"):
        for line in lines(folder, source):
            parsed = requirement(line)
            if parsed is not None:
                where.setdefault(canonicalize_name(parsed[0].name), parsed[1])
    installer = Installer(find_uv(options.uv), options.cached, where)
    install_txt = lines(folder, "install.txt")
    if any(requirement(line) for line in install_txt):
        installer.install_file(os.path.join(folder, "install.txt"), *constraints)
    if companions:
        installer.install("--no-deps", *companions)
    if late:
        print("gpuenv: installing without build isolation (they compile against the "
              "image's torch): " + " ".join(late), flush=True)
        index = [line for line in install_txt if line.startswith("-")]
        installer.install("--no-build-isolation", *index, *constraints, *late)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--cached", action="store_true")
    parser.add_argument("--uv")
    arguments = parser.parse_args()
    main(arguments.folder, arguments)
