# The two commands a newcomer needs, plus the benchmark. See README.md.
.PHONY: test demo bench docs clean

test:  ## every test (unit + integration), lint and types; sets up what it needs
	scripts/test.sh

demo:  ## gpuenv's main job end to end on examples/quickstart
	scripts/demo.sh

bench:  ## timings against Docker measured in the same run (bench/results.md)
	scripts/bench.sh

docs:  ## the reference site in docs/, built strictly into site/ (open site/index.html)
	scripts/dev-env.sh
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf .venv dist build .pytest_cache .mypy_cache .ruff_cache
