"""Inspect mode's capture (core/attention/capture.py): exact masses on attention whose answer is
known, the clipped masses equal to gather's label sums, and nothing changed when it is off."""
import pytest
import torch

from relpos_lab.core.attention import relative_attention
from relpos_lab.core.attention.capture import AttentionProbe, capturing


def _offset_minus_one(n, d=4, big=1e4):
    """q, k, rel_k with every logit 0 except at offset j - i = -1, which is `big`: each query but the
    first puts all its mass one key to the left; the first (no key there) spreads it evenly."""
    q = torch.zeros(1, 2, n, d, dtype=torch.float64)
    q[..., 0] = 1.0
    k = torch.zeros_like(q)
    rel_k = torch.zeros(2 * 2 + 1, d, dtype=torch.float64)
    rel_k[2 - 1, 0] = big * d**0.5  # label clip(-1) + k
    return q, k, rel_k


@pytest.mark.parametrize("impl", ["naive", "gather", "auto"])
def test_mass_by_offset_is_exact_on_known_attention(impl):
    n = 5
    q, k, rel_k = _offset_minus_one(n)
    probe = AttentionProbe()
    probe.where = ("encoder_self", 0)
    with capturing(probe):
        relative_attention(q, k, k, rel_k=rel_k, max_distance=2, impl=impl)
    offsets, mean = probe.mean_by_offset(("encoder_self", 0))
    expected = torch.zeros(2, len(offsets), dtype=torch.float64)
    expected[:, offsets.index(-1)] = (n - 1) / n  # n-1 of the n queries: all of their mass
    for j in range(n):  # query 0: 1/n on each key j, at offset j
        expected[:, offsets.index(j)] += 1 / n**2
    torch.testing.assert_close(mean, expected, rtol=0, atol=1e-12)
    assert probe.rows[("encoder_self", 0)] == n
    clipped = probe.mean_by_clipped_offset(("encoder_self", 0))  # offsets -2..2; 3 and 4 fold into +2
    torch.testing.assert_close(clipped[0], torch.tensor([0, (n - 1) / n, 1 / n**2, 1 / n**2, 3 / n**2],
                                                        dtype=torch.float64), rtol=0, atol=1e-12)


def test_padded_query_rows_are_excluded_and_the_example_map_cropped():
    n = 5
    q, k, rel_k = _offset_minus_one(n)
    q, k = q.expand(2, -1, -1, -1).contiguous(), k.expand(2, -1, -1, -1).contiguous()
    real = torch.tensor([[True] * n, [True, True, True, False, False]])
    probe = AttentionProbe()
    probe.where, probe.query_mask, probe.key_mask = "site", real, real
    with capturing(probe):
        relative_attention(q, k, k, rel_k=rel_k, max_distance=2, attn_mask=real[:, None, None, :], impl="gather")
    offsets, mean = probe.mean_by_offset("site")
    assert probe.rows["site"] == n + 3
    # Example 2: query 0 spreads over its 3 real keys; queries 1 and 2 sit at offset -1.
    at_minus_one = ((n - 1) + 2) / (n + 3)
    assert mean[0, offsets.index(-1)].item() == pytest.approx(at_minus_one, abs=1e-12)
    assert mean.sum(-1).tolist() == pytest.approx([1.0, 1.0], abs=1e-12)  # every real row: mass 1
    assert probe.example["site"].shape == (2, n, n)


def test_causal_decoding_offsets_and_growing_width():
    """A cached step (query_offset) adds at the absolute offsets; a longer call widens the sums."""
    torch.manual_seed(0)
    probe = AttentionProbe()
    probe.where = "dec"
    q, k = torch.randn(1, 1, 1, 4), torch.randn(1, 1, 6, 4)
    with capturing(probe):
        relative_attention(q, k[..., :3, :], k[..., :3, :], is_causal=True, query_offset=2)
        relative_attention(q, k, k, is_causal=True, query_offset=5)
    offsets, mean = probe.mean_by_offset("dec")
    assert min(offsets) == -5 and probe.rows["dec"] == 2
    assert all(mean[0, offsets.index(d)] == 0 for d in offsets if d > 0)  # causal: nothing ahead
    assert mean.sum().item() == pytest.approx(1.0)


@pytest.mark.parametrize("impl", ["gather", "naive", "batched", "auto"])
def test_capture_off_and_on_leave_the_output_bit_identical(impl):
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 2, 7, 8) for _ in range(3))
    rel = torch.randn(2 * 3 + 1, 8)
    args = dict(rel_k=rel, rel_v=rel * 0.5, max_distance=3, is_causal=True, impl=impl)
    off = relative_attention(q, k, v, **args)
    probe = AttentionProbe()
    with capturing(probe):
        on = relative_attention(q, k, v, **args)
    assert torch.equal(off, on) and probe.mass
    assert torch.equal(off, relative_attention(q, k, v, **args))


def test_probes_do_not_nest():
    with capturing(AttentionProbe()):
        with pytest.raises(RuntimeError, match="already capturing"):
            with capturing(AttentionProbe()):
                pass
