# inferfleet: the README's two commands are `make demo` and `make test`.
.PHONY: setup demo test lint bench clean

setup:
	scripts/setup.sh

demo: setup
	.venv/bin/inferfleet lab up

test: setup
	.venv/bin/pytest

lint: setup
	.venv/bin/pytest tests/test_lint.py

bench: setup
	.venv/bin/python benchmarks/model_sync.py

clean:
	-.venv/bin/inferfleet lab down
