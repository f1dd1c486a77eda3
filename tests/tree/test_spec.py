"""Tree spec strings (`chain:k=5`, `static:<name|file>`, `dynamic:depth=6,topk=8,budget=60`) and the one
spec-string grammar they share with drafters."""

from __future__ import annotations

import json

import pytest

from specdec.errors import ConfigError
from specdec.spec_strings import parse_spec
from specdec.tree.spec import BUILTIN_TREES, TreeKind, TreeSpec, parse_tree_spec, static


def test_chain_spec_sets_depth_and_budget_to_k():
    spec = parse_tree_spec("chain:k=5")
    assert spec == TreeSpec(TreeKind.CHAIN, depth=5, topk=1, budget=5)
    assert spec.max_nodes == 6


def test_chain_without_k_uses_the_default_of_five():
    assert parse_tree_spec("chain").budget == 5


def test_builtin_static_tree_has_its_choices_in_parent_first_order():
    spec = parse_tree_spec("static:tree-16")
    assert spec.kind is TreeKind.STATIC
    assert spec.budget == 16 and spec.max_nodes == 17
    assert spec.depth == 6  # (0, 0, 0, 0, 0, 0) is the deepest path
    assert spec.topk == 3  # ranks 0, 1, 2 at the root
    assert set(spec.choices) == set(BUILTIN_TREES["tree-16"])
    seen: set[tuple[int, ...]] = set()
    for choice in spec.choices:
        assert len(choice) == 1 or choice[:-1] in seen, f"{choice} comes before its parent"
        seen.add(choice)


def test_static_tree_from_a_json_file(tmp_path):
    path = tmp_path / "my-tree.json"
    path.write_text(json.dumps({"choices": [[0], [1], [0, 0], [0, 0, 0]]}))
    spec = parse_tree_spec(f"static:{path}")
    assert spec.choices == ((0,), (1,), (0, 0), (0, 0, 0))
    assert (spec.depth, spec.topk, spec.budget) == (3, 2, 4)


def test_static_tree_file_may_be_a_bare_list(tmp_path):
    path = tmp_path / "tree.json"
    path.write_text("[[0], [0, 0]]")
    assert parse_tree_spec(f"static:{path}").choices == ((0,), (0, 0))


def test_static_file_path_may_contain_colons_and_equals_signs(tmp_path):
    folder = tmp_path / "run:3" / "a=b"
    folder.mkdir(parents=True)
    path = folder / "t.json"
    path.write_text("[[0], [1]]")
    assert parse_tree_spec(f"static:{path}").budget == 2


def test_dynamic_spec_reads_depth_topk_and_budget():
    spec = parse_tree_spec("dynamic:depth=6,topk=8,budget=60")
    assert spec == TreeSpec(TreeKind.DYNAMIC, depth=6, topk=8, budget=60)
    assert spec.max_nodes == 61


def test_spec_kind_is_case_insensitive_and_whitespace_tolerant():
    assert parse_tree_spec("  Chain:k=3 ") == parse_tree_spec("chain:k=3")


def test_unknown_tree_kind_lists_the_kinds_there_are():
    with pytest.raises(ConfigError, match="unknown tree kind 'spiral'.*chain.*static.*dynamic"):
        parse_tree_spec("spiral:k=3")


@pytest.mark.parametrize("text, field", [("chain:k=five", "k"), ("chain:k=2.5", "k"),
                                         ("dynamic:depth=x,topk=8,budget=60", "depth"),
                                         ("dynamic:depth=6,topk=,budget=60", "topk")])
def test_non_integer_options_are_refused_by_name(text, field):
    with pytest.raises(ConfigError, match=f"{field} must be an integer"):
        parse_tree_spec(text)


@pytest.mark.parametrize("text", ["chain:k=-1", "dynamic:depth=0,topk=8,budget=60",
                                  "dynamic:depth=6,topk=8,budget=0"])
def test_sizes_below_the_minimum_are_refused(text):
    with pytest.raises(ConfigError):
        parse_tree_spec(text)


@pytest.mark.parametrize("text, option", [("chain:k=5,width=2", "width"), ("dynamic:depth=3,k=2", "k"),
                                          ("static:tree-8,depth=3", "depth")])
def test_unknown_options_are_named(text, option):
    with pytest.raises(ConfigError, match=f"unknown option.*{option}"):
        parse_tree_spec(text)


def test_tree_larger_than_the_node_budget_names_both_sizes():
    with pytest.raises(ConfigError, match=r"up to 61 nodes.*budget of 32"):
        parse_tree_spec("dynamic:depth=6,topk=8,budget=60", max_nodes=32)


def test_tree_exactly_at_the_node_budget_is_accepted():
    assert parse_tree_spec("chain:k=5", max_nodes=6).max_nodes == 6
    with pytest.raises(ConfigError, match="budget"):
        parse_tree_spec("chain:k=6", max_nodes=6)


def test_static_without_name_or_file_lists_the_builtin_trees():
    with pytest.raises(ConfigError, match="tree-16"):
        parse_tree_spec("static")


def test_static_with_an_unknown_name_says_no_tree_or_file_has_it():
    with pytest.raises(ConfigError, match="no built-in tree or file named 'tree-999'"):
        parse_tree_spec("static:tree-999")


def test_static_file_with_a_missing_parent_is_refused(tmp_path):
    path = tmp_path / "orphan.json"
    path.write_text(json.dumps({"choices": [[0], [0, 1, 0]]}))
    with pytest.raises(ConfigError, match=r"\(0, 1, 0\) has no parent \(0, 1\)"):
        parse_tree_spec(f"static:{path}")


def test_static_choice_that_skips_a_sibling_rank_is_refused():
    with pytest.raises(ConfigError, match=r"skips its sibling rank 0"):
        static([(1,)])


def test_static_file_that_is_not_json_is_refused_with_the_expected_format(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read tree file"):
        parse_tree_spec(f"static:{path}")


def test_static_file_with_no_choices_is_refused_as_a_config_error(tmp_path):
    """An empty choice list is a user error with a message, not a bare ValueError from max()."""
    path = tmp_path / "empty.json"
    path.write_text('{"choices": []}')
    with pytest.raises(ConfigError):
        parse_tree_spec(f"static:{path}")


def test_spec_parser_splits_name_and_key_values():
    assert parse_spec("ngram:n=3,k=8", what="drafter") == ("ngram", {"n": "3", "k": "8"})
    assert parse_spec("none", what="drafter") == ("none", {})


def test_spec_parser_keeps_a_path_with_colons_and_slashes_as_the_bare_argument():
    assert parse_spec("draft:/models/x:v2/weights", what="drafter") == ("draft", {"": "/models/x:v2/weights"})
    assert parse_spec("static:C:/trees/t.json", what="tree") == ("static", {"": "C:/trees/t.json"})


def test_spec_parser_keeps_an_equals_sign_inside_a_path():
    name, args = parse_spec("draft:/runs/lr=3e-4/model,quant=int8", what="drafter")
    assert name == "draft"
    assert args == {"": "/runs/lr=3e-4/model", "quant": "int8"}


def test_spec_parser_refuses_an_empty_spec():
    with pytest.raises(ConfigError, match="empty tree spec"):
        parse_spec("   ", what="tree")


def test_options_join_a_spec_that_has_a_path_with_a_comma():
    from specdec.spec_strings import with_options

    assert with_options("eagle", "trees=topk") == "eagle:trees=topk"
    joined = with_options("eagle:/runs/x:y", "trees=topk")
    assert joined == "eagle:/runs/x:y,trees=topk"
    assert parse_spec(joined, "drafter") == ("eagle", {"": "/runs/x:y", "trees": "topk"})
