# shellcheck shell=bash
# Service 'pypi': a package index (PEP 503 "simple" pages over real wheels from PyPI) for
# the build tests and the benchmark, whose builds have no network but loopback. A Python
# http.server (scripts/services/pypi.py) in the services' namespaces serves $STATE/pypi on
# a unix socket, reached as $PYPI (127.0.0.1:8099) both from the engines' builds (they run
# with host networking in the namespaces) and from the host, through two socat forwarders,
# 'pypi-engines' and 'pypi-host', as the registry is. Each request is a line of
# $PYPI_ACCESS_LOG ("TIME METHOD PATH STATUS"): the tests read which wheels a build
# downloaded. The wheels ($STATE/pypi/wheels) are downloaded from PyPI once and kept.
# Sourced by scripts/services.sh.

PYPI=127.0.0.1:8099
PYPI_SOCKET=$RUN/pypi.sock
PYPI_ROOT=$STATE/pypi
PYPI_WHEELS=$PYPI_ROOT/wheels
PYPI_ACCESS_LOG=$RUN/pypi-access.log
# Debian's Python, not the first python3 on the PATH (a pyenv shim, a virtual environment):
# the server needs nothing but the standard library, and pip for the download.
PYPI_PYTHON=/usr/bin/python3
# A training project's dependencies, for CPython 3.11 on manylinux x86_64 (the stand-in
# images are Debian bookworm, Python 3.11); uv, pip, setuptools and wheel, which builds
# install from the index; and tabulate, attrs and humanize, which none of the others
# needs, for the tests that add one requirement; JupyterLab, which `gpuenv notebook` runs.
PYPI_PROJECTS=(numpy==2.4.6 pandas==3.1.1 scipy==1.17.1 requests==2.34.2 tqdm==4.70.1
  pyyaml==6.0.4 rich==15.0.0 einops==0.8.2 safetensors==0.8.0 sentencepiece==0.2.3
  scikit-learn==1.9.1 matplotlib==3.11.2 tensorboard==2.21.0 uv==0.13.9 pip==26.3
  setuptools==84.2.1 wheel==0.48.0 tabulate==0.10.0 attrs==26.1.0 humanize==4.17.0
  jupyterlab==4.6.6)
# Their dependencies, pinned too, so that the set stays the same when one has a release.
PYPI_DEPENDENCIES=(absl-py==2.5.1 certifi==2026.10.19.post1 charset-normalizer==3.5.3
  cloudpickle==3.1.3 contourpy==1.3.3 cycler==0.12.1 fonttools==4.68.0 grpcio==1.85.3
  idna==3.20 joblib==1.6.0 kiwisolver==1.5.1 markdown==3.11.3 markdown-it-py==4.3.0
  markupsafe==3.0.4 mdurl==0.1.2 narwhals==2.29.0 packaging==26.4 pillow==13.0.0
  protobuf==7.36.2 pygments==2.21.0 pyparsing==3.3.3 python-dateutil==4.0.0
  tensorboard-data-server==0.7.2 threadpoolctl==3.8.0 typing-extensions==4.16.0
  tzdata==2026.6 urllib3==2.8.0 werkzeug==3.1.9
  # JupyterLab's, for `gpuenv notebook`
  anyio==4.16.0 argon2-cffi==25.1.0 argon2-cffi-bindings==26.2.0 arrow==1.4.0
  asttokens==3.0.2 async-lru==2.4.0 babel==2.19.0 beautifulsoup4==4.15.0 bleach==6.4.0
  cffi==2.1.1 comm==0.2.3 debugpy==1.8.22 defusedxml==0.7.1 executing==2.3.0
  fastjsonschema==2.22.3 fqdn==1.6.0 h11==0.16.0 httpcore==1.0.9 httpx==0.29.0
  ipykernel==7.4.0 ipython==9.18.1 ipython-pygments-lexers==1.1.1 isoduration==20.11.0
  jedi==0.20.1 jinja2==3.1.6 json5==0.17.3 jsonpointer==3.12 jsonschema==4.26.0
  jsonschema-specifications==2025.9.1 jupyter-builder==1.3.0 jupyter-client==8.10.0
  jupyter-core==5.9.1 jupyter-events==0.12.1 jupyter-lsp==2.3.1 jupyter-server==2.21.1
  jupyter-server-terminals==0.5.4 jupyterlab-pygments==0.3.0 jupyterlab-server==2.28.1
  lark==1.3.1 matplotlib-inline==0.2.2 mistune==3.4.0 nbclient==0.11.0 nbconvert==7.17.2
  nbformat==5.11.1 nest-asyncio2==1.7.4 notebook-shim==0.2.4 overrides==7.7.0
  pandocfilters==1.5.1 parso==0.8.7 pexpect==4.9.0 platformdirs==4.14.9
  prometheus-client==0.26.0 prompt-toolkit==3.0.53 psutil==7.2.2 ptyprocess==0.7.0
  pure-eval==0.2.4 pycparser==3.12 python-json-logger==4.2.0 pyzmq==27.3.0
  referencing==0.37.0 rfc3339-validator==0.1.4 rfc3986-validator==0.1.1
  rfc3987-syntax==1.1.0 rpds-py==2026.9.1 send2trash==2.2.0 six==1.17.0 soupsieve==2.10
  stack-data==0.6.3 terminado==0.18.1 tinycss2==1.5.1 tornado==6.6.1 traitlets==5.16.1
  uri-template==1.3.0 wcwidth==0.9.4 webcolors==25.10.0 webencodings==0.6.1
  websocket-client==1.9.2)
PYPI_WHEELS_VERSION=2  # bump when the lists above change: the wheels are downloaded again

# Checked by path: a python3 or pip3 earlier on the PATH is not Debian's.
pypi_packages() { echo socat:socat /usr/bin/python3:python3 /usr/bin/pip3:python3-pip; }
pypi_needs() { echo netns; }

pypi_download() {  # the wheels of $PYPI_PROJECTS and their dependencies, from PyPI, once
  # per $PYPI_WHEELS_VERSION (written in the marker when the download is complete)
  local marker=$PYPI_WHEELS/.complete
  if [ "$(cat "$marker" 2>/dev/null)" = "$PYPI_WHEELS_VERSION" ]; then
    return 0
  fi
  log "downloading the package index's wheels from PyPI (about 190 MB, the first time only)"
  rm -rf "$PYPI_WHEELS"
  mkdir -p "$PYPI_WHEELS"
  # --isolated: PyPI alone, whatever pip's environment variables and the user's pip.conf
  # add (find-links, extra indexes). Every dependency is pinned, so the resolution checks
  # the lists rather than choosing. The three manylinux platforms cover the wheels' tags.
  "$PYPI_PYTHON" -m pip --isolated download --index-url https://pypi.org/simple/ \
    --only-binary=:all: --implementation cp --python-version 3.11 --abi cp311 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --dest "$PYPI_WHEELS" \
    "${PYPI_PROJECTS[@]}" "${PYPI_DEPENDENCIES[@]}" >"$RUN/pypi-download.log" 2>&1 ||
    die "pip download of the package index's wheels failed (log: $RUN/pypi-download.log)"
  echo "$PYPI_WHEELS_VERSION" >"$marker"
}

pypi_local_wheel() {  # gpuenv-needs-torch 1.0, made here: a package that requires torch,
  # for the tests that a requirement depending on torch never replaces the image's torch
  "$PYPI_PYTHON" scripts/services/pypi.py needs-torch-wheel "$PYPI_WHEELS"
}

pypi_index() {  # $PYPI_ROOT/simple, made again when a wheel is newer than it
  local top=$PYPI_ROOT/simple/index.html
  # (the JSON pages came later: an index without them is written again)
  if [ -f "$top" ] && [ -f "$PYPI_ROOT/simple/tqdm/index.json" ] &&
    [ -z "$(find "$PYPI_WHEELS" -newer "$top" -print -quit)" ]; then
    return 0
  fi
  log "writing the package index's pages ($PYPI_ROOT/simple)"
  "$PYPI_PYTHON" scripts/services/pypi.py index "$PYPI_ROOT"
}

pypi_serve() {  # pypi_serve LAUNCHER...: the server on $PYPI_SOCKET, in the namespace
  # LAUNCHER enters
  local pidfile=$RUN/pypi.pid
  if alive "$pidfile"; then
    return 0
  fi
  rm -f "$PYPI_SOCKET"
  log "starting the package index on $PYPI_SOCKET"
  # The script by its absolute path: entering a mount namespace moves to its root.
  setsid "$@" "$PYPI_PYTHON" "$PWD/scripts/services/pypi.py" serve "$PYPI_ROOT" \
    "$PYPI_SOCKET" "$PYPI_ACCESS_LOG" >"$RUN/pypi.log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  wait_for 30 "the package index (log: $RUN/pypi.log)" test -S "$PYPI_SOCKET"
}

pypi_answers() {  # pypi_answers [LAUNCHER...]: the index answers at $PYPI, from the
  # namespace LAUNCHER runs in (this one when none)
  "$@" "$PYPI_PYTHON" -c \
    "import urllib.request; urllib.request.urlopen('http://$PYPI/simple/', timeout=1)"
}

pypi_up() {  # the wheels and their index, reachable as $PYPI from the engines'
  # namespace and from this one
  local -a in_netns
  in_netns=(nsenter --target "$(netns_pid)" --net --mount --)
  pypi_download
  pypi_local_wheel
  pypi_index
  pypi_serve "${in_netns[@]}"
  forward pypi-engines "$PYPI" "$PYPI_SOCKET" "${in_netns[@]}"
  forward pypi-host "$PYPI" "$PYPI_SOCKET"
  wait_for 30 "the package index, from the engines (log: $RUN/pypi-engines.log)" \
    pypi_answers "${in_netns[@]}"
  wait_for 30 "the package index, from the host (log: $RUN/pypi-host.log)" pypi_answers
}

pypi_down() {
  stop "$RUN/pypi-host.pid" "the package index's forwarder on the host"
  stop "$RUN/pypi-engines.pid" "the package index's forwarder for the engines"
  stop "$RUN/pypi.pid" "the package index"
}

pypi_status() {
  alive "$RUN/pypi.pid" && alive "$RUN/pypi-engines.pid" && alive "$RUN/pypi-host.pid"
}
