"""Resolves a project's Python dependencies against an NGC image, and installs exactly
what gpuenv.lock then pins.

Run by the image's own python3 (so it needs nothing but pip), in two modes:

  install.py FOLDER --resolve OUT    at `gpuenv lock` (or the first build), in a container
                                     of the pinned base: checks every pin against the image,
                                     then asks pip what it would install (`pip install
                                     --dry-run --report`, which resolves against the image's
                                     installed distributions and honours its constraint
                                     files) and writes that, with the image's inventory, to
                                     OUT as JSON. Nothing is installed.
  install.py --check-base COUNT DIGEST
                                     the first build step: the base is the one the lock
                                     was resolved against.
  install.py FOLDER --locked [--cached] [--uv UV]
                                     at build time: installs the locked files with hashes
                                     required and no dependency resolution.

--resolve reads the files gpuenv wrote into FOLDER:

  image.tsv        packages the image provides: NAME, the project's specifier, where the
                   pin was written, and the series to install when the image lacks it
  install.txt      requirements to resolve (pip options first)
  late.txt         requirements that compile against the image's torch: resolved (and
                   installed) without build isolation, unless the image ships them
  constraints.txt  the project's own -c constraints
  prefer.txt       the versions the lock had (kept unless an edit or an upgrade moves them)
  cutoff.txt       a date: only files the indexes say were uploaded before it (pip's
                   --uploaded-prior-to, pip 26.0 or later: installed here if need be)

and checks, before pip runs, every pin against what the image has: the versions of its
installed distributions and the pins of its pip constraint files (PIP_CONSTRAINT, e.g. NGC
PyTorch's /etc/pip/constraint.txt). A conflict is printed as one line, starting with
"gpuenv: conflict:", naming the package, the project's pin and the image's version, and
it stops. NVIDIA's builds match a pin "in the NGC sense": an exact pin ==X.Y.Z is
satisfied by any build of the X.Y series (0.20.0a0+afc54f7 for ==0.20.1), any other
specifier by the release the build precedes. This mirrors gpuenv.project.packages
(ngc_satisfies); tests/unit/test_ngc_pins.py holds the two to the same table.

--check-base COUNT DIGEST (the first step of a build) compares the base's distributions
with the count and digest the lock recorded. --locked reads options.txt (index options,
one a line), overlay.txt and overlay-late.txt
(`NAME==VERSION --hash=sha256:HEX` lines) and paths.txt (the project's folders, `-e .`,
put on the path through a .pth file: they are mounted at /workspace in runs). The installer is uv (`uv pip install
--system`) when UV runs in this image, else pip; both with --no-deps and --require-hashes.
With --cached their download caches are cache mounts that outlive the build (never in the
image; pip-install.sh passes it only for a cache that is this build's user's alone,
cache-ours.sh). A file whose bytes differ from the lock ends with the line "gpuenv: hash
mismatch: NAME==VERSION: the lock has sha256:X, the index served sha256:Y"; any other
failure with "gpuenv: failed: NAME (FILE:LINE): the installer's reason".
"""

import argparse
import hashlib
import json
import os
import re
import subprocess
import site
import sys
import sysconfig
import urllib.request
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


MISSING_VERSION = ("there is no version of", "No matching distribution",
                   "Could not find a version")


class Installer:
    """pip or uv, run the same way for each call: the image's own python3, its system
    site-packages (NVIDIA's builds are there). Installing the lock, nothing is resolved,
    so the image's constraint files are not read (the lock already honours them).
    `where` names the file and line of each requirement, for the message when one
    cannot be installed."""

    def __init__(self, uv, cached, where=None):
        self.uv = uv
        self.cached = cached
        self.where = where or {}

    def install(self, *args):
        if self.uv:
            command = [self.uv, "pip", "install", "--system", "--break-system-packages",
                       "--python", sys.executable, *_uv_args(args)]
            env = dict(os.environ, UV_LINK_MODE="copy", UV_PYTHON_DOWNLOADS="never",
                       UV_NO_PROGRESS="1")
            env.pop("UV_TORCH_BACKEND", None)  # never pick torch builds for the build host
            env.pop("UV_CONSTRAINT", None)
            if not self.cached:
                env["UV_NO_CACHE"] = "1"
        else:
            command = [sys.executable, "-m", "pip", "install", *args]
            env = pip_environment(self.cached)
        env["PIP_CONSTRAINT"] = ""
        name = "uv pip" if self.uv else "pip"
        print(f"gpuenv: {name} install " + " ".join(args), flush=True)
        code, tail = run_logged(command, env)
        text = "\n".join(tail)
        if code and self.cached and any(m in text for m in MISSING_VERSION):
            # The cache keeps index pages for minutes: a version locked since may be
            # missing from them. Once more, with the pages asked for again.
            print("gpuenv: the installer's cached index pages may predate the lock: "
                  "installing again with them refreshed", flush=True)
            if self.uv:
                command.insert(3, "--refresh")
            else:
                env["PIP_NO_CACHE_DIR"] = "1"
            code, tail = run_logged(command, env)
        if code:
            mismatch = hash_mismatch(tail)
            if mismatch:
                print(f"gpuenv: hash mismatch: {mismatch}", flush=True)
            else:
                print(f"gpuenv: failed: {self.explain(tail)}", flush=True)
            sys.exit(code)

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


def pip_environment(cached):
    env = dict(os.environ, PIP_BREAK_SYSTEM_PACKAGES="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_ROOT_USER_ACTION="ignore", PIP_NO_INPUT="1")
    if not cached:
        env["PIP_NO_CACHE_DIR"] = "1"
    return env


def run_logged(command, env):
    """Runs COMMAND, its output passed on line by line; (exit status, its last 40 lines)."""
    tail = []
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace") as child:
        for line in child.stdout:
            print(line, end="", flush=True)
            tail = (tail + [line.rstrip()])[-40:]
    return child.returncode, tail


_HEX = re.compile(r"(?:sha256[:=]?\s*)?([0-9a-f]{64})")


def hash_mismatch(tail):
    """`NAME==VERSION: the lock has sha256:X, the index served sha256:Y` when the
    installer refused a file for its hash, else None. pip says `    NAME==V from URL
    ...:` then `Expected sha256 X` and `Got Y`; uv `Hash mismatch for `NAME==V``, then
    `Expected:` and `Computed:`, each followed by `sha256:HEX`."""
    name, expected, got, want = None, None, None, None
    for line in tail:
        text = line.strip()
        found = re.search(r"Hash mismatch for `([^`]+)`", text)
        if found:
            name = found.group(1)
        elif re.match(r"^[A-Za-z0-9_.\-\[\]]+==\S+ from ", text) and text.endswith(":"):
            name = text.split(" ", 1)[0]
        if text.startswith("Expected"):
            want = "expected"
        elif text.startswith(("Got", "Computed")):
            want = "got"
        digest = _HEX.search(text)
        if digest and want == "expected" and expected is None:
            expected = digest.group(1)
        elif digest and want == "got" and got is None:
            got = digest.group(1)
    if not (name and expected and got):
        return None
    return f"{name}: the lock has sha256:{expected}, the index served sha256:{got}"


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


def installed_distributions():
    """{canonical name: version} of every distribution the image's Python sees."""
    installed = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            installed.setdefault(canonicalize_name(name), dist.version)
    return installed


def inventory_digest(installed):
    """(count, "sha256:HEX") of the sorted `name==version` lines (canonical names): what
    gpuenv.lock records of the base (`overlay.base`), and a build checks again."""
    listed = "".join(f"{name}=={installed[name]}\n" for name in sorted(installed))
    return len(installed), "sha256:" + hashlib.sha256(listed.encode()).hexdigest()


def check_pins(folder, installed):
    """The pins checked against the image (see the module docstring): the companions to
    install without dependencies and the late requirements (those the image does not
    ship already); exit 3 after printing every conflict."""
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
    return companions, late


def requirement_places(folder):
    """{canonical name: "FILE:LINE"} of every requirement the project wrote."""
    where = {}
    for source in ("install.txt", "late.txt"):
        for line in lines(folder, source):
            parsed = requirement(line)
            if parsed is not None:
                where.setdefault(canonicalize_name(parsed[0].name), parsed[1])
    return where


# What pip says when no set of versions fits (a re-resolve may then keep fewer of the
# lock's versions), as against an index it cannot reach or a package it cannot build.
UNRESOLVABLE = ("ResolutionImpossible", "conflicting dependencies", "No matching distribution",
                "Could not find a version that satisfies")


# The pip a resolution as of a date runs when the image's is older than 26.0 (the first
# with --uploaded-prior-to): PyPI's file of pip 26.3, by its sha256, into a folder of
# this container alone.
CUTOFF_PIP = "pip==26.3 --hash=sha256:f3b60b20ffaadd4415ed7957212a38ac63fa4c5fa375bd0f4a797777940fad13"
CUTOFF_PIP_DIR = "/tmp/gpuenv-pip"


def release(version):
    parts = [int(p) if p.isdigit() else 0 for p in version.split(".")[:2]] + [0, 0]
    return tuple(parts[:2])


def check_pip(folder, cutoff):
    """Exit with one line when the image's pip cannot report a resolution (22.2); for a
    resolution as of a date, pip 26.0 or later (installed for this container when the
    image's is older)."""
    version = pip_version()
    if not version or release(version) < (22, 2):
        print(f"gpuenv: failed: the image's pip ({version or 'none'}) cannot report what it "
              "would install (`pip install --dry-run --report` needs pip 22.2 or later)",
              flush=True)
        sys.exit(3)
    if not cutoff or release(version) >= (26, 0):
        return
    pinned = os.path.join(folder, "cutoff-pip.txt")
    with open(pinned, "w", encoding="utf-8") as handle:
        handle.write(CUTOFF_PIP + "\n")
    index = [line for line in lines(folder, "install.txt") if line.startswith("-")]
    print(f"gpuenv: the image's pip {version} cannot resolve as of a date: using pip 26.3",
          flush=True)
    code, tail = run_logged([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                             "--only-binary", ":all:", "--target", CUTOFF_PIP_DIR, *index,
                             "-r", pinned], pip_environment(cached=False))
    if code:
        print(f"gpuenv: failed: pip 26.3, which a resolution as of a date needs, could not "
              f"be installed here: {Installer(None, False).explain(tail)}", flush=True)
        sys.exit(3)
    os.environ["PYTHONPATH"] = CUTOFF_PIP_DIR + os.pathsep + os.environ.get("PYTHONPATH", "")


def dry_run(folder, name, args, where):
    """pip's answer to `pip install --dry-run ARGS`: the report's `install` items (what it
    would install on top of this image, resolved against what the image has)."""
    report = os.path.join(folder, f"report-{name}.json")
    cutoff = lines(folder, "cutoff.txt")
    dated = ["--uploaded-prior-to", cutoff[0]] if cutoff else []
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
               "--report", report, *dated, *args]
    print("gpuenv: pip install --dry-run " + " ".join(args), flush=True)
    code, tail = run_logged(command, pip_environment(cached=False))
    if code:
        text = "\n".join(tail)
        kind = "unresolvable" if any(m in text for m in UNRESOLVABLE) else "failed"
        print(f"gpuenv: {kind}: {Installer(None, False, where).explain(tail)}", flush=True)
        sys.exit(code)
    with open(report, encoding="utf-8") as handle:
        return json.load(handle).get("install") or []


def file_sha256(url):
    """The sha256 of the file at URL (file:, http:, https:), for a file whose link
    carried none; None when it cannot be read."""
    try:
        with urllib.request.urlopen(url, timeout=300) as answer:
            digest = hashlib.sha256()
            for block in iter(lambda: answer.read(1 << 20), b""):
                digest.update(block)
            return digest.hexdigest()
    except (OSError, ValueError):
        return None


def locked_item(item, group):
    """What the lock keeps of one report item (PEP 610 `download_info`)."""
    info = item.get("download_info") or {}
    archive = info.get("archive_info")
    out = {
        "name": canonicalize_name(item["metadata"]["name"]),
        "version": item["metadata"]["version"],
        "url": info.get("url", ""),
        "requested": bool(item.get("requested")),
        "direct": bool(item.get("is_direct")),
        "group": group,
    }
    if isinstance(archive, dict):
        hashes = archive.get("hashes") or {}
        sha = hashes.get("sha256")
        if not sha and str(archive.get("hash", "")).startswith("sha256="):
            sha = archive["hash"].split("=", 1)[1]
        out["sha256"] = sha or file_sha256(out["url"])
    elif "vcs_info" in info:
        out["vcs"] = info["vcs_info"].get("vcs", "")
        out["commit"] = info["vcs_info"].get("commit_id", "")
    elif "dir_info" in info:
        out["directory"] = True
        out["editable"] = bool(info["dir_info"].get("editable"))
    return out


def resolve(folder, out):
    installed = installed_distributions()
    companions, late = check_pins(folder, installed)
    if companions or late or any(requirement(line) for line in lines(folder, "install.txt")):
        check_pip(folder, lines(folder, "cutoff.txt"))
    where = requirement_places(folder)
    keep = os.path.join(folder, "keep.txt")
    with open(keep, "w", encoding="utf-8") as handle:
        for name in KEPT:
            if name in installed:
                handle.write(f"{name}=={installed[name]}\n")
    constraints = []
    for name in ("keep.txt", "constraints.txt", "prefer.txt"):
        if lines(folder, name):
            constraints += ["-c", os.path.join(folder, name)]
    install_txt = lines(folder, "install.txt")
    index = [line for line in install_txt if line.startswith("-")]
    found = []
    if any(requirement(line) for line in install_txt):
        items = dry_run(folder, "install", [*constraints, "-r", os.path.join(folder, "install.txt")],
                        where)
        found += [locked_item(item, "install") for item in items]
    if companions:
        items = dry_run(folder, "companions", ["--no-deps", *index, *companions], where)
        found += [locked_item(item, "companion") for item in items]
    if late:
        chosen = os.path.join(folder, "chosen.txt")
        with open(chosen, "w", encoding="utf-8") as handle:
            handle.writelines(f"{item['name']}=={item['version']}\n" for item in found)
        items = dry_run(folder, "late", ["--no-build-isolation", *index, *constraints,
                                         "-c", chosen, *late], where)
        found += [locked_item(item, "late") for item in items]
    packages = {}
    for item in found:
        packages.setdefault(item["name"], item)
    count, digest = inventory_digest(installed)
    constraint_files = {}
    for path in os.environ.get("PIP_CONSTRAINT", "").split():
        if os.path.isfile(path):
            with open(path, "rb") as handle:
                constraint_files[path] = "sha256:" + hashlib.sha256(handle.read()).hexdigest()
    result = {
        "format": 1,
        "pip": pip_version(),
        "python": ".".join(str(n) for n in sys.version_info[:3]),
        "inventory": {"count": count, "digest": digest},
        "constraint_files": constraint_files,
        "packages": sorted(packages.values(), key=lambda item: item["name"]),
        "where": where,
    }
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1, sort_keys=True)
    print(f"gpuenv: resolved {len(packages)} package(s) on top of the image's {count}", flush=True)


def pip_version():
    try:
        return metadata.version("pip")
    except metadata.PackageNotFoundError:
        return ""


def check_base(want_count, want_digest):
    """Exit 3 when the base is not the one the lock was resolved against (run as the
    first step, before apt can add Python packages of its own)."""
    count, digest = inventory_digest(installed_distributions())
    if digest != want_digest:
        print(f"gpuenv: conflict: the base image's Python distributions ({count}, {digest}) are "
              f"not those gpuenv.lock was resolved against ({want_count}, {want_digest}): run "
              "`gpuenv lock` to resolve again on this base", flush=True)
        sys.exit(3)


def install_locked(folder, options):
    index = lines(folder, "options.txt")
    where = {}
    for line in lines(folder, "overlay.txt") + lines(folder, "overlay-late.txt"):
        where.setdefault(line.split("==", 1)[0], "gpuenv.lock")
    installer = Installer(find_uv(options.uv), options.cached, where)
    locked = ["--no-deps", "--require-hashes", *index]
    if lines(folder, "overlay.txt"):
        installer.install(*locked, "-r", os.path.join(folder, "overlay.txt"))
    paths = lines(folder, "paths.txt")
    if paths:
        # The project's own folders (`-e .`), mounted at /workspace in runs: importable
        # from any working directory, edits seen at once, as an editable install.
        site_dir = next(d for d in site_folders() if os.path.isdir(d))
        with open(os.path.join(site_dir, "gpuenv-project.pth"), "w", encoding="utf-8") as handle:
            handle.writelines(f"{path}\n" for path in paths)
        print("gpuenv: the project's folders are on the path in runs: " + " ".join(paths))
    if lines(folder, "overlay-late.txt"):
        print("gpuenv: installing without build isolation (they compile against the "
              "image's torch)", flush=True)
        installer.install("--no-build-isolation", *locked, "-r",
                          os.path.join(folder, "overlay-late.txt"))


def site_folders():
    """The site folders this Python reads .pth files from, on its path (Debian's Python
    3.8 names a purelib folder that does not exist, pypa/pip#10151)."""
    found = [d for d in site.getsitepackages() if d in sys.path]
    return found + [sysconfig.get_paths()["purelib"]]


def main(folder, options):
    if options.check_base:
        check_base(*options.check_base)
    elif options.resolve:
        resolve(folder, options.resolve)
    elif options.locked:
        install_locked(folder, options)
    else:
        sys.exit("install.py: --check-base COUNT DIGEST, FOLDER --resolve OUT or FOLDER --locked")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", nargs="?")
    parser.add_argument("--check-base", nargs=2, metavar=("COUNT", "DIGEST"))
    parser.add_argument("--resolve")
    parser.add_argument("--locked", action="store_true")
    parser.add_argument("--cached", action="store_true")
    parser.add_argument("--uv")
    arguments = parser.parse_args()
    main(arguments.folder, arguments)
