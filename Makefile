# inferfleet: the README's two commands are `make demo` and `make test`.
.PHONY: setup demo test test-fresh lint bench bench-lb bench-routing gpu-bundle clean

setup:
	scripts/setup.sh

demo: setup
	.venv/bin/inferfleet lab up

test: setup
	scripts/test.sh

# The test command as on a machine that never ran the project: every image, wheelhouse
# and cache rebuilt from the registries (scripts/forget-caches.sh says what goes).
test-fresh:
	scripts/forget-caches.sh
	$(MAKE) test

lint: setup
	.venv/bin/pytest tests/test_lint.py

bench: setup
	.venv/bin/python benchmarks/model_sync.py

bench-lb: setup
	.venv/bin/inferfleet lab up
	.venv/bin/python benchmarks/lb_overhead.py

# guidellm (the load client) in an environment of its own: its dependencies stay out of
# the project's.
.venv-bench/bin/guidellm: benchmarks/requirements.txt
	python3 -m venv .venv-bench
	.venv-bench/bin/pip install -q -r benchmarks/requirements.txt
	touch $@

bench-routing: setup .venv-bench/bin/guidellm
	.venv/bin/inferfleet lab up --routing cache_aware
	.venv/bin/python benchmarks/routing.py

# The GPU check bundle for a GPU machine without network (docs/gpu-validation.md).
gpu-bundle: setup
	scripts/gpu-check/bundle.sh

clean:
	-.venv/bin/inferfleet lab down
