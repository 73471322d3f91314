"""kaiyuan.minhash against datasketch (the reference) and against exact Jaccard."""

import random

import numpy as np
import pyarrow as pa
import pytest
from datasketch import MinHash
from datasketch.lsh import _optimal_param

from kaiyuan import minhash as mh


def _words(rng, n, vocab=5000):
    return [f"w{rng.randrange(vocab)}" for _ in range(n)]


def _pair_with_jaccard(rng, n_shingles, target):
    """Two sets of 64-bit values with Jaccard close to `target`: shared core plus distinct extras."""
    # |A|=|B|=m, |A∩B|=c: J = c / (2m - c)  ->  c = 2mJ / (1 + J)
    m = n_shingles
    c = round(2 * m * target / (1 + target))
    core = [rng.getrandbits(64) for _ in range(c)]
    a = core + [rng.getrandbits(64) for _ in range(m - c)]
    b = core + [rng.getrandbits(64) for _ in range(m - c)]
    return a, b, c / (2 * m - c)


def test_vectorized_shingles_match_the_reference():
    rng = random.Random(3)
    docs = [" ".join(_words(rng, rng.randrange(0, 60))) for _ in range(200)]
    docs += ["", "one", "two words", "Ünïcode straße Ⅸ café — punctuation, ignored!", "  \n\t  "]
    got = mh.document_shingles(docs, 5, "word")
    off = got.offsets
    for i, d in enumerate(docs):
        norm = mh.normalize_for_shingles(pa.array([d]))[0].as_py()
        tokens = [t for t in pa.compute.split_pattern_regex(pa.array([norm]), mh._SEPARATORS)[0].as_py() if t]
        assert list(got.values[off[i]:off[i + 1]]) == mh.shingle_hashes_reference(tokens, 5), d


def test_normalization_ignores_case_punctuation_and_compatibility_forms():
    a = mh.document_shingles(["The QUICK brown fox, jumps: over the lazy dog ﬁnally"], 3)
    b = mh.document_shingles(["the quick brown fox jumps over the lazy dog finally"], 3)
    assert list(a.values) == list(b.values)


def test_signatures_equal_datasketch_affine64_exactly():
    rng = random.Random(0)
    docs = [" ".join(_words(rng, rng.randrange(1, 400))) for _ in range(30)]
    sh = mh.document_shingles(docs, 5)
    a, b = mh.permutations(112, seed=7)
    sig = mh.signatures(sh, a, b)
    off = sh.offsets
    for i in range(len(docs)):
        ref = MinHash(num_perm=112, seed=7, scheme="affine64", hashfunc=lambda x: x)
        ref.update_batch([int(x) for x in sh.values[off[i]:off[i + 1]]])
        assert np.array_equal(ref.hashvalues, sig[i])


def test_documents_without_tokens_have_no_shingles_and_empty_signatures():
    sh = mh.document_shingles(["", "...", "!!! ???"], 5)
    assert list(sh.lengths) == [0, 0, 0]
    sig = mh.signatures(sh, *mh.permutations(16, 1))
    assert (sig == mh.MAX_U64).all()


def test_estimated_jaccard_tracks_exact_and_datasketch():
    """On text pairs with planted edits: our estimate, datasketch's (its own sha1 hashing of the
    shingle strings) and the exact Jaccard of the shingle sets agree within MinHash error."""
    rng = random.Random(11)
    num_perm = 256
    a_, b_ = mh.permutations(num_perm, 1)
    errs_exact, errs_ds = [], []
    for _ in range(60):
        base = _words(rng, 300)
        other = list(base)
        for pos in rng.sample(range(300), rng.randrange(0, 40)):
            other[pos] = f"x{rng.randrange(10**9)}"
        texts = [" ".join(base), " ".join(other)]
        sh = mh.document_shingles(texts, 5)
        sig = mh.signatures(sh, a_, b_)
        ours = float(mh.estimate_jaccard(sig[0], sig[1]))
        grams = [{" ".join(w[i:i + 5]) for i in range(len(w) - 4)} for w in (base, other)]
        exact = mh.exact_jaccard(*grams)
        ds = []
        for g in grams:
            m = MinHash(num_perm=num_perm, seed=1)
            m.update_batch([s.encode() for s in g])
            ds.append(m)
        errs_exact.append(ours - exact)
        errs_ds.append(ours - ds[0].jaccard(ds[1]))
    # standard error of one estimate is sqrt(J(1-J)/k) <= 0.031 for k=256
    assert max(abs(e) for e in errs_exact) < 0.13
    assert abs(np.mean(errs_exact)) < 0.015            # unbiased
    assert max(abs(e) for e in errs_ds) < 0.18
    assert abs(np.mean(errs_ds)) < 0.02


@pytest.mark.parametrize("target", [0.5, 0.7, 0.8, 0.9])
def test_candidate_rate_matches_the_s_curve(target):
    rng = random.Random(int(target * 100))
    bands, rows = 14, 8
    a, b = mh.permutations(bands * rows, 1)
    n_pairs = 600
    hits = 0
    js = []
    for _ in range(n_pairs):
        x, y, j = _pair_with_jaccard(rng, 200, target)
        js.append(j)
        vals = np.array(x + y, dtype=np.uint64)
        sh = mh.Ragged(vals, np.array([len(x), len(y)], dtype=np.int64))
        keys = mh.band_keys(mh.signatures(sh, a, b), bands, rows)
        hits += bool((keys[0] == keys[1]).any())
    expected = float(np.mean([mh.candidate_probability(j, bands, rows) for j in js]))
    observed = hits / n_pairs
    sd = (expected * (1 - expected) / n_pairs) ** 0.5
    assert abs(observed - expected) <= 4 * sd + 0.01, (observed, expected)


@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.75, 0.8, 0.9])
@pytest.mark.parametrize("num_perm", [64, 112, 128])
def test_bands_rows_optimiser_agrees_with_datasketch(threshold, num_perm):
    assert mh.optimal_bands_rows(threshold, num_perm) == _optimal_param(threshold, num_perm, 0.5, 0.5)


def test_optimiser_weights_shift_the_choice():
    b_fp, r_fp = mh.optimal_bands_rows(0.8, 128, 0.9, 0.1)     # false positives costly: steeper, later curve
    b_fn, r_fn = mh.optimal_bands_rows(0.8, 128, 0.1, 0.9)
    assert mh.candidate_probability(0.7, b_fp, r_fp) < mh.candidate_probability(0.7, b_fn, r_fn)
    assert mh.optimal_bands_rows(0.8, 128, 0.9, 0.1) == _optimal_param(0.8, 128, 0.9, 0.1)


def test_threshold_of_fineweb_defaults():
    assert mh.threshold_of(14, 8) == pytest.approx(0.719, abs=1e-3)
    assert mh.candidate_probability(0.8, 14, 8) == pytest.approx(0.924, abs=1e-3)


def test_char_shingles_for_text_without_spaces():
    zh = ["北京大学的学生在图书馆里学习中文和数学", "北京大学的学生在图书馆里学习中文和物理"]
    words = mh.document_shingles(zh, 3, "word")
    assert list(words.lengths) == [1, 1]            # one "word" each: useless for near-dup
    chars = mh.document_shingles(zh, 3, "char")
    assert list(chars.lengths) == [17, 17]
    common = set(chars.values[:17]) & set(chars.values[17:])
    assert len(common) == 15
    auto = mh.document_shingles(zh + ["plain english words here and there"], 3, "auto")
    assert list(auto.lengths) == [17, 17, 4]
    assert list(mh.uses_char_shingles(pa.array(zh + ["english text"]))) == [True, True, False]


def test_band_keys_equal_for_equal_bands_only():
    rng = random.Random(5)
    base = " ".join(_words(rng, 300))
    sh = mh.document_shingles([base, base, base + " extra tail words appended"], 5)
    keys = mh.band_keys(mh.signatures(sh, *mh.permutations(112, 1)), 14, 8)
    assert keys.dtype == np.int64 and keys.shape == (3, 14)
    assert (keys[0] == keys[1]).all()
    assert 0 < (keys[0] == keys[2]).sum() < 14
    with pytest.raises(ValueError):
        mh.band_keys(np.zeros((1, 10), dtype=np.uint64), 3, 4)


def test_fold64_matches_scalar_reference():
    rng = np.random.default_rng(0)
    cols = [rng.integers(0, 2**63, 50, dtype=np.uint64) * np.uint64(2) for _ in range(4)]
    got = mh.fold64(cols)
    for i in range(50):
        assert int(got[i]) == mh.fold64_scalar([int(c[i]) for c in cols])


def test_exact_intersections_of_many_pairs_equal_python_sets():
    rng = random.Random(5)
    docs = [" ".join(_words(rng, rng.randrange(0, 80), vocab=40)) for _ in range(60)]
    sets = mh.shingle_sets(mh.document_shingles(docs, 3, "word"))
    off = sets.offsets
    as_set = [set(sets.values[off[i]:off[i + 1]].tolist()) for i in range(len(docs))]
    assert all(list(sets.values[off[i]:off[i + 1]]) == sorted(as_set[i]) for i in range(len(docs)))   # sorted, no repeats
    pairs = [(rng.randrange(60), rng.randrange(60)) for _ in range(300)]

    def take(ix):
        return mh.Ragged(np.concatenate([sets.values[off[i]:off[i + 1]] for i in ix]), sets.lengths[list(ix)])

    a, b = take([p for p, _ in pairs]), take([q for _, q in pairs])
    inter = mh.intersection_sizes(a, b)
    assert inter.tolist() == [len(as_set[p] & as_set[q]) for p, q in pairs]
    js = mh.jaccard(inter, a.lengths, b.lengths)
    assert js.tolist() == [mh.exact_jaccard(as_set[p], as_set[q]) for p, q in pairs]
    assert mh.exact_jaccard(set(), set()) == 1.0 and mh.exact_jaccard({1}, set()) == 0.0


@pytest.mark.parametrize("threshold, expected", [(0.7, (18, 6)), (0.8, (14, 8))])
def test_bands_rows_for_a_threshold_favour_recall(threshold, expected):
    b, r = mh.lsh_bands_rows(threshold, 112)
    assert (b, r) == expected                               # 0.8 gives FineWeb's 14 x 8
    assert mh.candidate_probability(threshold, b, r) >= 0.89
    balanced = mh.optimal_bands_rows(threshold, 112)
    assert mh.candidate_probability(threshold, b, r) > mh.candidate_probability(threshold, *balanced) + 0.3
