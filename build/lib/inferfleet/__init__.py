"""inferfleet: provision LLM inference fleets with Ansible.

The CLI imports the inferfleet.fleet collection's logic (`ansible_collections.inferfleet.
fleet.plugins...`) and also templates inventories with Ansible in-process. Both must see
the collection through Ansible's own collection loader, installed here before anything
imports from it: a collection package imported the plain way first has no metadata, and
Ansible's plugin routing then refuses it.
"""

__version__ = "0.1.0"


def _install_collection_loader() -> None:
    try:
        from ansible.plugins.loader import init_plugin_loader
    except ImportError:  # a Python without Ansible (the GPU checks' tiny-model helper)
        return
    init_plugin_loader()


_install_collection_loader()
