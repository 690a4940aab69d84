"""moe_cpu.select_experts and moe_align_block_size against the NumPy reference and hand-computed cases."""
import itertools

import numpy as np
import pytest

import moe_cpu
from conftest import ref

RTOL = 1e-5      # weights: float32 core vs float64 reference
ATOL = 1e-7


def check_route(logits, top_k, **kw):
    w, ids = moe_cpu.select_experts(logits, top_k, **kw)
    rw, rids = ref.select_experts_ref(logits, top_k, **kw)
    assert w.dtype == np.float32 and ids.dtype == np.int32 and w.shape == ids.shape == rids.shape
    np.testing.assert_array_equal(ids, rids, err_msg=str(kw))
    np.testing.assert_allclose(w, rw, rtol=RTOL, atol=ATOL, err_msg=str(kw))
    return w, ids


# ---------------------------------------------------------------- vs reference, every mode
@pytest.mark.parametrize("renormalize,scoring,bias,factor", list(itertools.product(
    [False, True], ["softmax", "sigmoid"], [False, True], [1.0, 2.5])))
def test_not_grouped(rng, renormalize, scoring, bias, factor):
    M, E, k = 37, 16, 4
    logits = (rng.standard_normal((M, E)) * 2).astype(np.float32)
    b = rng.standard_normal(E).astype(np.float32) * 0.5 if bias else None
    check_route(logits, k, renormalize=renormalize, scoring_func=scoring, e_score_correction_bias=b,
                routed_scaling_factor=factor)


@pytest.mark.parametrize("renormalize,scoring,bias", list(itertools.product(
    [False, True], ["softmax", "sigmoid"], [False, True])))
@pytest.mark.parametrize("E,G,topk_group,k", [(16, 4, 2, 4), (32, 8, 3, 6), (16, 8, 4, 2), (12, 3, 1, 4)])
def test_grouped(rng, renormalize, scoring, bias, E, G, topk_group, k):
    M = 29
    logits = rng.standard_normal((M, E)).astype(np.float32)
    b = rng.standard_normal(E).astype(np.float32) * 0.3 if bias else None
    check_route(logits, k, renormalize=renormalize, scoring_func=scoring, use_grouped_topk=True,
                num_expert_group=G, topk_group=topk_group, e_score_correction_bias=b,
                routed_scaling_factor=2.5)


def test_grouped_one_expert_per_group(rng):
    logits = rng.standard_normal((9, 8)).astype(np.float32)
    kw = dict(use_grouped_topk=True, num_expert_group=8, topk_group=4)
    check_route(logits, 2, renormalize=True, **kw)
    with pytest.raises(ValueError):      # the biased group score is a top-2 sum: needs 2 experts per group
        moe_cpu.select_experts(logits, 2, e_score_correction_bias=np.zeros(8, np.float32), **kw)


def test_single_token_and_k_equals_e(rng):
    check_route(rng.standard_normal((1, 6)).astype(np.float32), 6, renormalize=True)
    check_route(rng.standard_normal((1, 6)).astype(np.float32), 1)


# ---------------------------------------------------------------- hand-computed
def test_softmax_by_hand():
    logits = np.float32([[1, 2, 3, 0]])
    w, ids = moe_cpu.select_experts(logits, 2)
    np.testing.assert_array_equal(ids, [[2, 1]])
    # e^3 / (1 + e + e^2 + e^3) = 0.64391426, e^2 / (...) = 0.23688282
    np.testing.assert_allclose(w, [[0.6439142598879722, 0.23688281808991013]], rtol=RTOL)
    w, ids = moe_cpu.select_experts(logits, 2, renormalize=True)
    # softmax of [3, 2] = [1 / (1 + e^-1), 1 / (1 + e)]
    np.testing.assert_allclose(w, [[0.7310585786300049, 0.2689414213699951]], rtol=RTOL)


def test_sigmoid_by_hand():
    w, ids = moe_cpu.select_experts(np.float32([[0, 1, -1, 2]]), 2, scoring_func="sigmoid",
                                    renormalize=True, routed_scaling_factor=2.0)
    np.testing.assert_array_equal(ids, [[3, 1]])
    # 2 * sig(2) / (sig(2) + sig(1)), 2 * sig(1) / (sig(2) + sig(1))
    np.testing.assert_allclose(w, [[2 * 0.5464491031607007, 2 * 0.4535508968392993]], rtol=RTOL)


def test_grouped_by_hand():
    # 4 groups of 2. Without bias a group scores its max: groups 0 (3.0) and 1 (2.9) -> ids [1, 2].
    # With a (zero) bias a group scores the sum of its top-2 sigmoids: groups 1 (1.89) and 3 (1.46)
    # win, and the best two experts inside are 2 and 3.
    logits = np.float32([[0.0, 3.0, 2.9, 2.8, 2.5, -1.0, 1.0, 1.0]])
    kw = dict(scoring_func="sigmoid", use_grouped_topk=True, num_expert_group=4, topk_group=2)
    w, ids = moe_cpu.select_experts(logits, 2, **kw)
    np.testing.assert_array_equal(ids, [[1, 2]])
    np.testing.assert_allclose(w, [[0.9525741268224334, 0.9478464369215823]], rtol=RTOL)   # sig(3), sig(2.9)
    w, ids = moe_cpu.select_experts(logits, 2, e_score_correction_bias=np.zeros(8, np.float32),
                                    routed_scaling_factor=2.5, **kw)
    np.testing.assert_array_equal(ids, [[2, 3]])
    np.testing.assert_allclose(w, [[2.5 * 0.9478464369215823, 2.5 * 0.9426758241011313]], rtol=RTOL)


def test_bias_changes_selection_not_weights():
    # softmax scores of [0, 0, 1] are [0.2119, 0.2119, 0.5761]; a bias of +1 on expert 0 selects it first,
    # but its weight stays its unbiased score.
    w, ids = moe_cpu.select_experts(np.float32([[0, 0, 1]]), 1, e_score_correction_bias=np.float32([1, 0, 0]))
    np.testing.assert_array_equal(ids, [[0]])
    np.testing.assert_allclose(w, [[1 / (2 + np.e)]], rtol=RTOL)


def test_ties_go_to_lower_index():
    _, ids = moe_cpu.select_experts(np.float32([[1, 3, 3, 0, 3], [5, 5, 5, 5, 5]]), 3)
    np.testing.assert_array_equal(ids, [[1, 2, 4], [0, 1, 2]])
    _, ids = moe_cpu.select_experts(np.float32([[2, 2, 2, 2, 1, 1, 1, 1]]), 2, scoring_func="sigmoid",
                                    use_grouped_topk=True, num_expert_group=4, topk_group=1)
    np.testing.assert_array_equal(ids, [[0, 1]])


# ---------------------------------------------------------------- moe_align_block_size
def test_align_by_hand():
    ids = np.int32([[2, 0], [2, -1], [0, 2]])       # slots 0..5, pad value M*k = 6
    sorted_ids, expert_ids, n = moe_cpu.moe_align_block_size(ids, 3, 2)
    assert n == 6
    np.testing.assert_array_equal(sorted_ids[:n], [1, 4, 0, 2, 5, 6])   # expert 0: 1, 4; expert 2: 0, 2, 5
    np.testing.assert_array_equal(expert_ids[:n // 2], [0, 2, 2])


def test_align_num_experts_past_the_largest_id_adds_nothing():
    """Experts with no rows have no blocks, so a num_experts up to int32's limit costs nothing more."""
    ids = np.int32([[2, 0], [2, -1], [0, 2]])
    want = moe_cpu.moe_align_block_size(ids, 3, 2)
    got = moe_cpu.moe_align_block_size(ids, 2**31 - 1, 2)
    assert got[2] == want[2] == 6
    np.testing.assert_array_equal(got[0][:6], want[0][:6])
    np.testing.assert_array_equal(got[1][:3], want[1][:3])


@pytest.mark.parametrize("M,E,k,bs", [(1, 4, 2, 4), (37, 8, 2, 16), (64, 16, 4, 8), (5, 3, 3, 1), (0, 4, 2, 4)])
def test_align_vs_reference(rng, M, E, k, bs):
    ids = np.argsort(rng.random((M, E)), axis=1)[:, :k].astype(np.int32)
    ids[rng.random((M, k)) < 0.1] = -1
    sorted_ids, expert_ids, n = moe_cpu.moe_align_block_size(ids, E, bs)
    rs, re, rn = ref.moe_align_block_size_ref(ids, E, bs)
    assert n == rn and sorted_ids.dtype == np.int32 and expert_ids.dtype == np.int32
    # Arrays may be allocated larger than the padded length (as in SGLang); the first n entries are defined.
    assert len(sorted_ids) >= n and len(expert_ids) >= n // bs
    np.testing.assert_array_equal(sorted_ids[:n], rs)
    np.testing.assert_array_equal(expert_ids[:n // bs], re)
