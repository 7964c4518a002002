"""A worker pipeline's step as micro-batches (`coral.runtime.pipeline.micro_batches`): the
step model's `min(stages, requests)` near-equal micro-batches, no request split."""

from __future__ import annotations

from coral.runtime.messages import WorkItem
from coral.runtime.pipeline import micro_batches


def _decode(rid: str) -> WorkItem:
    return WorkItem(rid, 10, (5,), step=3)


def test_min_of_stages_and_requests_micro_batches_each_request_whole():
    items = [_decode(f"d{k}") for k in range(5)] + [WorkItem("p", 0, tuple(range(8)))]
    groups = micro_batches(items, 3)
    assert len(groups) == 3
    assert sorted(i.request_id for g in groups for i in g) == sorted(i.request_id for i in items)
    # the 8-token prompt alone balances the five decode tokens of the other two
    sizes = sorted(sum(len(i.token_ids) for i in g) for g in groups)
    assert sizes == [2, 3, 8]
    assert len(micro_batches(items[:2], 3)) == 2
    assert micro_batches(items[:1], 3) == [items[:1]]


def test_releases_ride_with_the_first_micro_batch():
    rel = WorkItem("gone", 0, (), release=True)
    groups = micro_batches([_decode("a"), rel, _decode("b")], 2)
    assert rel in groups[0] and all(rel not in g for g in groups[1:])
    assert micro_batches([rel], 2) == [[rel]]
