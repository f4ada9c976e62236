import pytest
from ansible_collections.inferfleet.fleet.plugins.module_utils.instances import (
    InventoryError,
    instances,
    rank_of,
    serving_nodes,
)


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
