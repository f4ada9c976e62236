import pytest
from ansible_collections.inferfleet.fleet.plugins.module_utils.instances import (
    InventoryError,
    instance_models,
    instances,
    rank_of,
    serving_nodes,
)


def served_models(models):
    return sorted({model["served"] for model in models.values()})


def test_each_hosts_variables_are_looked_up_once():
    """In Ansible each hostvars[host] merges all of that host's variables again: a filter
    evaluated for every host of a 32-node play pays it 32 x 32 times, so once per host."""
    from ansible_collections.inferfleet.fleet.plugins.filter.inventory import FilterModule

    looked = []

    class HostVars(dict):
        def get(self, host, default=None):
            looked.append(host)
            return super().get(host, default)

    hv = HostVars(a={"inferfleet_instance": "big", "inferfleet_rank": 1},
                  b={"inferfleet_instance": "big", "inferfleet_rank": 0}, c={})
    rank = FilterModule().filters()["rank"]("a", ["a", "b", "c"], hv)
    assert rank == {"instance": "big", "rank": 1, "size": 2, "members": ["b", "a"]}
    assert sorted(looked) == ["a", "b", "c"]
    looked.clear()
    ranks = FilterModule().filters()["ranks"](["a", "b", "c"], hv)  # every host's at once
    assert sorted(looked) == ["a", "b", "c"]
    assert ranks == {h: FilterModule().filters()["rank"](h, ["a", "b", "c"], hv) for h in "abc"}
    assert ranks["c"] == {"instance": "c", "rank": 0, "size": 1, "members": ["c"]}


def test_default_every_node_is_its_own_instance():
    groups = instances(["a", "b"], {})
    assert groups == {"a": ["a"], "b": ["b"]}
    assert serving_nodes(groups) == ["a", "b"]


def test_pipeline_group_in_inventory_order_and_explicit_rank():
    hv = {"a": {"inferfleet_instance": "big"}, "b": {"inferfleet_instance": "big"}, "c": {}}
    assert instances(["a", "b", "c"], hv) == {"big": ["a", "b"], "c": ["c"]}
    hv["a"]["inferfleet_rank"], hv["b"]["inferfleet_rank"] = 1, 0
    groups = instances(["a", "b", "c"], hv)
    assert groups["big"] == ["b", "a"]
    assert rank_of("a", groups) == ("big", 1, 2)
    assert serving_nodes(groups) == ["b", "c"]


@pytest.mark.parametrize(
    "hv, words",
    [
        (
            {
                "a": {"inferfleet_instance": "g", "inferfleet_rank": 0},
                "b": {"inferfleet_instance": "g"},
            },
            ["instance g", "inferfleet_rank", "missing on b"],
        ),
        (
            {
                "a": {"inferfleet_instance": "g", "inferfleet_rank": 0},
                "b": {"inferfleet_instance": "g", "inferfleet_rank": 2},
            },
            ["instance g", "0..1"],
        ),
    ],
)
def test_bad_ranks_are_refused_with_what_to_change(hv, words):
    with pytest.raises(InventoryError) as err:
        instances(["a", "b"], hv)
    for word in words:
        assert word in str(err.value)


def test_empty_group_is_refused():
    with pytest.raises(InventoryError, match="`inference` group is empty"):
        instances([], {})


def test_the_first_instance_to_bring_up_alone_is_the_first_with_no_node_serving():
    from ansible_collections.inferfleet.fleet.plugins.filter.inventory import FilterModule

    first = FilterModule().filters()["first_not_serving"]
    hosts = ["a", "p0", "p1", "c"]
    hv = {
        "a": {},
        "p0": {"inferfleet_instance": "big"},
        "p1": {"inferfleet_instance": "big"},
        "c": {},
    }
    assert first(hosts, hv) == ["a"]  # nothing serves: a first deployment
    hv["a"]["rollout_serving"] = True
    assert first(hosts, hv) == ["p0", "p1"]  # a pipeline instance comes up whole
    hv["p1"]["rollout_serving"] = True  # one member serving: that instance is not new
    assert first(hosts, hv) == ["c"]
    hv["c"]["rollout_serving"] = True
    assert first(hosts, hv) == []  # every instance serves: nothing to bring up alone


FLEET = {"inferfleet_model_name": "llama", "inferfleet_model_version": "v1"}


def test_a_single_model_fleet_serves_the_fleet_wide_model_everywhere():
    hv = {"a": dict(FLEET), "p0": {**FLEET, "inferfleet_instance": "big"}}
    hv["p1"] = dict(hv["p0"])
    models = instance_models(instances(["a", "p0", "p1"], hv), hv)
    llama = {"served": "llama", "name": "llama", "version": "v1"}
    assert models == {"a": llama, "big": llama}
    assert served_models(models) == ["llama"]


def test_two_groups_serve_two_models():
    qwen = {"inferfleet_model_name": "qwen", "inferfleet_model_version": 3}  # a group's vars
    hv = {"a": dict(FLEET), "b": dict(FLEET), "q": {**FLEET, **qwen}}
    models = instance_models(instances(["a", "b", "q"], hv), hv)
    assert models["a"] == models["b"] == {"served": "llama", "name": "llama", "version": "v1"}
    assert models["q"] == {"served": "qwen", "name": "qwen", "version": "3"}
    assert served_models(models) == ["llama", "qwen"]


def test_members_of_one_instance_must_serve_one_model():
    hv = {
        "n1": {**FLEET, "inferfleet_instance": "g"},
        "n2": {**FLEET, "inferfleet_instance": "g", "model_sync_version": "v2"},
    }
    with pytest.raises(InventoryError) as err:
        instance_models(instances(["n1", "n2"], hv), hv)
    message = str(err.value)
    for words in ["instance g (n1, n2)", "disagree on the version", "n1=v1, n2=v2"]:
        assert words in message
    assert "weights name" not in message  # only what differs is listed


def test_one_served_name_for_two_models_is_refused():
    hv = {
        "a": dict(FLEET),
        "q": {**FLEET, "model_sync_name": "qwen", "inference_engine_served_model_name": "llama"},
    }
    with pytest.raises(InventoryError) as err:
        instance_models(instances(["a", "q"], hv), hv)
    for words in ["instances a (a) and q (q)", "both serve llama", "(llama and qwen)"]:
        assert words in str(err.value)


def test_versions_may_differ_between_instances_during_a_rollout():
    hv = {"a": dict(FLEET), "b": {**FLEET, "model_sync_version": "v2"}}
    models = instance_models(instances(["a", "b"], hv), hv)
    assert (models["a"]["version"], models["b"]["version"]) == ("v1", "v2")
    assert served_models(models) == ["llama"]


def test_an_explicit_served_name_overrides_the_model_name():
    hv = {
        "a": {**FLEET, "inference_engine_served_model_name": "chat"},
        "b": {**FLEET, "inference_engine_served_model_name": ""},  # empty: the default
    }
    models = instance_models(instances(["a", "b"], hv), hv)
    assert models["a"] == {"served": "chat", "name": "llama", "version": "v1"}
    assert models["b"]["served"] == "llama"
    assert served_models(models) == ["chat", "llama"]


def test_a_host_with_no_model_is_refused():
    hv = {"a": dict(FLEET), "b": {"inferfleet_model_version": "v1"}}
    with pytest.raises(InventoryError, match="b: no model served name or weights name"):
        instance_models(instances(["a", "b"], hv), hv)
