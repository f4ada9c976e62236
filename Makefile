# inferfleet: the README's two commands are `make demo` and `make test`.
.PHONY: setup demo test lint bench bench-lb clean

setup:
	scripts/setup.sh

demo: setup
	.venv/bin/inferfleet lab up

test: setup
	scripts/test.sh

lint: setup
	.venv/bin/pytest tests/test_lint.py

bench: setup
	.venv/bin/python benchmarks/model_sync.py

bench-lb: setup
	.venv/bin/inferfleet lab up
	.venv/bin/python benchmarks/lb_overhead.py

clean:
	-.venv/bin/inferfleet lab down
