"""The path-segment trie answers exactly what the double loop answers."""

from hypothesis import given, settings
from hypothesis import strategies as st

from gitlease.core.pathindex import PathIndex, naive_overlapping
from gitlease.core.scope import ROOT

# Few segment names, including prefixes of one another ("a", "ab"), so that segment-awareness matters.
SEG = st.sampled_from(["a", "ab", "b", "src", "s"])
SCOPE = st.one_of(st.just(ROOT), st.lists(SEG, min_size=1, max_size=4).map("/".join))
SCOPES = st.lists(SCOPE, min_size=1, max_size=3)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 12), SCOPES),
        st.tuples(st.just("remove"), st.integers(0, 12), st.just([])),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(OPS, st.lists(SCOPES, min_size=1, max_size=8))
def test_index_matches_naive_double_loop(ops, queries):
    index: PathIndex[int, int] = PathIndex()
    model: dict[int, list[str]] = {}
    for op, key, scopes in ops:
        if op == "add":
            index.add(key, scopes, payload=key)
            model.pop(key, None)  # re-adding replaces and moves the key to the end
            model[key] = scopes
        else:
            assert index.remove(key) == (key in model)
            model.pop(key, None)
    assert len(index) == len(model) and set(index) == set(model)
    for q in queries:
        assert index.overlapping(q) == naive_overlapping(model, q)
        assert index.any_overlapping(q) == bool(naive_overlapping(model, q))


@settings(max_examples=100, deadline=None)
@given(st.lists(SCOPES, min_size=1, max_size=20))
def test_removing_everything_leaves_an_empty_trie(adds):
    index: PathIndex[int, None] = PathIndex()
    for i, scopes in enumerate(adds):
        index.add(i, scopes)
    for i in range(len(adds)):
        assert index.remove(i)
    assert len(index) == 0 and not index._root.children and not index._root.keys
    assert index.overlapping([ROOT]) == [] and not index.any_overlapping([ROOT])


def test_ancestors_subtree_and_siblings():
    index: PathIndex[str, str] = PathIndex()
    index.add("svc", ["services"], "p1")
    index.add("billing", ["services/billing"])
    index.add("deep", ["services/billing/tax/rates.py"])
    index.add("billing2", ["services/billing2"])
    index.add("libs", ["libs/tax", "docs"])
    assert index.overlapping(["services/billing"]) == ["svc", "billing", "deep"]  # ancestor, itself, below
    assert index.overlapping(["services/billing/tax"]) == ["svc", "billing", "deep"]
    assert index.overlapping(["services/bill"]) == ["svc"]  # segment-aware: not a string prefix
    assert index.overlapping(["libs"]) == ["libs"] and index.overlapping(["docs/x", "libs/tax/y"]) == ["libs"]
    assert index.overlapping(["other"]) == [] and not index.any_overlapping(["other"])
    assert index.overlapping([ROOT]) == ["svc", "billing", "deep", "billing2", "libs"]
    assert index.payload("svc") == "p1" and index.scopes("libs") == ("libs/tax", "docs")
    index.add("all", [ROOT])
    assert index.overlapping(["other"]) == ["all"] and index.any_overlapping(["x/y"])
    assert index.remove("all") and not index.remove("all")
    assert index.remove("deep")
    assert index.overlapping(["services/billing/tax"]) == ["svc", "billing"]
