"""Names vulture cannot see used (read by `make test`'s dead-code check); each is used by
something vulture does not follow, named on its line."""

delimiter  # noqa: B018  - string.Template reads a subclass's delimiter
mtime  # noqa: B018  - tarfile.TarInfo fields, read by TarFile.addfile
linkname  # noqa: B018  - tarfile.TarInfo fields, read by TarFile.addfile
on_broken_pipe  # noqa: B018  - rich.Console calls it when stdout closes (cli/ui.py)
server_version  # noqa: B018  - http.server's handler attributes and methods (cli/dashboard.py)
sys_version  # noqa: B018
log_message  # noqa: B018
do_HEAD  # noqa: B018
daemon_threads  # noqa: B018  - socketserver.ThreadingMixIn reads it
address_family  # noqa: B018  - socketserver reads it (cli/dashboard_server.py)
send_error  # noqa: B018  - http.server calls it for the errors it answers itself (400, 414, 501)
trust_env  # noqa: B018  - requests.Session reads it (engine/distribution.py: no ~/.netrc)
framework_version_unknown  # noqa: B018  - written in `gpuenv matrix --json` (asdict) and read by tests
