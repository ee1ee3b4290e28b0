"""Container engines: the protocols the core sees (`protocol`), and the adapters behind
them (`dockerpy`, Docker's on every transport; `podman`). `connection.connect()` is the one
place that picks an adapter (and imports one); only the CLI calls it.
"""
