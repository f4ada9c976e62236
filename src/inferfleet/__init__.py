"""inferfleet: provision LLM inference fleets with Ansible."""

__version__ = "0.1.0"
