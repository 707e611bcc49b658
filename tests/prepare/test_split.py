"""The held-out split by source file: parts disjoint in files (stats.split_by_group, prepare.corpus.split_items)."""

from __future__ import annotations

import pytest

from trajscope.errors import TrajscopeError
from trajscope.prepare.corpus import _chunks, split_items
from trajscope.stats import split_ids


def _items():
    items = []
    for kind, n_groups in (("stdlib", 12), ("chat", 8)):
        for g in range(n_groups):
            for i in range(1 + g % 3):
                items.append({"id": f"{kind}{g}#{i}", "group": f"{kind}-file{g}", "kind": kind})
    return items


def test_split_by_group_is_disjoint_in_groups():
    ids = [f"p{i}" for i in range(60)]
    groups = [f"f{i % 13}" for i in range(60)]
    parts = split_ids(ids, seed=3, groups=groups)
    group_of = dict(zip(ids, groups))
    files = {name: {group_of[i] for i in v} for name, v in parts.items()}
    assert not files["fit"] & files["calibrate"] and not files["fit"] & files["evaluate"]
    assert not files["calibrate"] & files["evaluate"]
    assert sorted(sum(parts.values(), [])) == sorted(ids)
    # the same ids split by id alone share files between parts: the group split is what makes them disjoint
    by_id = split_ids(ids, seed=3)
    assert {group_of[i] for i in by_id["fit"]} & {group_of[i] for i in by_id["evaluate"]}


def test_split_by_group_refuses_bad_input():
    with pytest.raises(ValueError):
        split_ids(["a", "b"], groups=["f"])
    with pytest.raises(TrajscopeError):  # two groups cannot fill three parts
        split_ids(["a", "b", "c"], groups=["f", "f", "g"])


def test_corpus_split_is_disjoint_in_files_within_every_kind():
    items = _items()
    part = split_items(items, (0.5, 0.25, 0.25), seed=0)
    parts_of_group: dict = {}
    for it in items:
        parts_of_group.setdefault(it["group"], set()).add(part[it["id"]])
    assert all(len(p) == 1 for p in parts_of_group.values())
    for kind in ("stdlib", "chat"):
        assert {part[it["id"]] for it in items if it["kind"] == kind} == {"fit", "calibrate", "evaluate"}


def test_chunks_cut_at_line_ends_and_cover_the_start():
    text = "".join(f"line {i}\n" for i in range(100))
    pieces = _chunks(text, 3, 50)
    assert len(pieces) == 3 and all(p.endswith("\n") for p in pieces)
    assert text.startswith("".join(pieces))
